"""A row's prompt fields beside ``prompt`` and ``messages``: vLLM's ``prompt_token_ids``
(TokensPrompt) in every format, and ``chat_template_kwargs`` / ``add_generation_prompt``
passed to the chat template (oracle: the tokenizer's own ``apply_chat_template`` with the
same arguments); every misuse named by its field."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from mlxpa.batch.prompts import row_prompt
from mlxpa.data import read_rows
from mlxpa.data.reader_options import InputOptions
from mlxpa.data.validate import run_problem, validate
from mlxpa.inputs import InputProcessor
from mlxpa.sampling_params import SamplingParams
from tests.tiny_models import byte_tokenizer

# A template that shows its variables: the generation prompt and a "style" variable.
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if style %}[{{ style }}]{% endif %}{% if add_generation_prompt %}bot:{% endif %}")


def _jsonl(tmp_path, rows: list[dict]) -> str:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_token_id_rows_in_jsonl_parquet_and_csv(tmp_path):
    rows = [{"id": "a", "prompt_token_ids": [5, 6, 7], "max_tokens": 2},
            {"id": "b", "prompt": "hi"}]
    (a, b) = read_rows(_jsonl(tmp_path, rows))
    assert (a.prompt, a.messages, a.prompt_token_ids, a.error) == (None, None, [5, 6, 7], None)
    assert a.params == {"max_tokens": 2} and b.prompt_token_ids is None
    pq.write_table(pa.Table.from_pylist([{"prompt_token_ids": [9, 8]}]), tmp_path / "t.parquet")
    (row,) = read_rows(str(tmp_path / "t.parquet"))
    assert row.prompt_token_ids == [9, 8] and row.error is None
    (tmp_path / "t.csv").write_text('prompt_token_ids\n"[3, 4]"\n')
    (row,) = read_rows(str(tmp_path / "t.csv"))
    assert row.prompt_token_ids == [3, 4] and row.error is None
    assert InputProcessor(byte_tokenizer()).prompt_token_ids(row_prompt(row)) == [3, 4]


def test_token_id_row_problems_name_the_field(tmp_path):
    src = _jsonl(tmp_path, [{"prompt_token_ids": []}, {"prompt_token_ids": [1, -2]},
                            {"prompt_token_ids": [1, True]}, {"prompt_token_ids": "12"},
                            {"prompt": "x", "prompt_token_ids": [1]},
                            {"messages": [{"role": "user", "content": "x"}],
                             "prompt_token_ids": [1]}])
    errors = [r.error for r in read_rows(src)]
    want = 'field "prompt_token_ids" must be a non-empty list of token ids (integers >= 0)'
    for i in range(4):
        assert errors[i].startswith(f"{src} line {i + 1}: {want}"), errors[i]
    assert errors[4].endswith('give field "prompt" or field "prompt_token_ids", not both')
    assert errors[5].endswith('give field "messages" or field "prompt_token_ids", not both')
    (row,) = read_rows(_jsonl(tmp_path, [{"prompt_token_ids": [1]}]),
                       InputOptions(system="Be brief."))
    assert row.error.endswith('field "prompt_token_ids": --system needs a text prompt or '
                              "messages")


def test_token_ids_outside_the_vocabulary_are_a_row_problem(tmp_path):
    (ok, bad) = read_rows(_jsonl(tmp_path, [{"prompt_token_ids": [0, 255]},
                                            {"prompt_token_ids": [3, 256]}]))
    assert run_problem(ok, SamplingParams(), InputProcessor(None, 256)) is None
    assert run_problem(bad, SamplingParams(), InputProcessor(None, 256)) == (
        'field "prompt_token_ids": token id 256 is outside the model\'s vocabulary (256 ids, '
        "0..255)")
    v = validate(read_rows(_jsonl(tmp_path, [{"prompt_token_ids": [3, 256]}])),
                 source="in.jsonl", unit="line", vocab_size=256)
    assert v.num_problems == 1 and "token id 256" in v.problems[0]


def test_chat_template_kwargs_reach_the_template(tmp_path):
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    fast = byte_tokenizer()._tokenizer
    fast.chat_template = TEMPLATE
    tok = TokenizerWrapper(fast, eos_token_ids={1})
    messages = [{"role": "user", "content": "hey"}]
    rows = read_rows(_jsonl(tmp_path, [
        {"messages": messages},
        {"messages": messages, "chat_template_kwargs": {"style": "terse"}},
        {"messages": messages, "add_generation_prompt": False},
        {"messages": messages, "add_generation_prompt": False,
         "chat_template_kwargs": {"add_generation_prompt": True}},  # the kwargs win (vLLM)
    ]))
    got = [InputProcessor(tok).prompt_token_ids(row_prompt(r)) for r in rows]

    def oracle(**kwargs) -> list[int]:
        return tok.apply_chat_template(messages, **kwargs)

    assert got[0] == oracle(add_generation_prompt=True)
    assert got[1] == oracle(add_generation_prompt=True, style="terse")
    assert got[2] == oracle(add_generation_prompt=False)
    assert got[3] == got[0]
    assert tok.decode(got[1]).endswith("[terse]bot:") and tok.decode(got[2]).endswith("hey\n")


def test_template_fields_misused(tmp_path):
    messages = [{"role": "user", "content": "x"}]
    src = _jsonl(tmp_path, [{"prompt": "x", "chat_template_kwargs": {"a": 1}},
                            {"messages": messages, "add_generation_prompt": "yes"},
                            {"messages": messages, "chat_template_kwargs": ["a"]},
                            {"messages": messages, "chat_template_kwargs": {"tokenize": True}},
                            {"custom_id": "c", "url": "/v1/chat/completions",
                             "body": {"messages": messages, "add_generation_prompt": False}}])
    rows = list(read_rows(src))
    assert rows[0].error.endswith('field "chat_template_kwargs" needs field "messages"')
    assert 'field "add_generation_prompt" must be true or false, got "yes"' in rows[1].error
    assert 'field "chat_template_kwargs" must be an object of template variables' in rows[2].error
    assert 'field "chat_template_kwargs" must be' in rows[3].error
    assert rows[4].error is None and rows[4].chat_template_kwargs == {
        "add_generation_prompt": False}
