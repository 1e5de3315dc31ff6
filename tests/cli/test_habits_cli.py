"""What a user of mlx-lm or vLLM types: ``mlxpa generate --prompt`` (``mlx_lm.generate``'s
one prompt) prints what ``LLM.generate`` gives; mlx-lm's and vLLM's flags that mlxpa spells
otherwise get a one-line hint (``--temp``); ``mlxpa serve MODEL`` takes the model as vLLM's
``vllm serve MODEL`` does; ``--chat-template`` gives a folder without a template one (a file
or the text); the server's ``developer`` role is read as ``system``."""

from __future__ import annotations

import pytest

from mlxpa import LLM, SamplingParams
from tests.cli.helpers import cli, write_jsonl
from tests.tiny_models import save_tiny_model

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A tiny llama folder without a chat template."""
    return save_tiny_model(tmp_path_factory.mktemp("m") / "plain")


def test_generate_prints_what_llm_generate_gives(plain):
    want = LLM(plain, kv_cache_memory_bytes=2**22, seed=3).generate(  # --seed: the engine's
        "the cat\tsat", SamplingParams(max_tokens=6, temperature=0.8), use_tqdm=False)
    r = cli("generate", "-p", "the cat\\tsat", "--model", plain, "--max-tokens", 6,
            "--temperature", 0.8, "--seed", 3, "--kv-cache-memory-bytes", 2**22, "-q")
    assert r.exit_code == 0, r.output
    assert r.stdout == want[0].outputs[0].text + "\n"


def test_generate_chat_renders_the_template_it_is_given(plain, tmp_path):
    llm = LLM(plain, kv_cache_memory_bytes=2**22)
    params = SamplingParams(max_tokens=5)
    (want,) = llm.chat([{"role": "user", "content": "hi"}], params, use_tqdm=False,
                       chat_template=TEMPLATE)
    assert llm.get_tokenizer().decode(want.prompt_token_ids).endswith("<user>hi<assistant>")
    path = tmp_path / "t.jinja"
    path.write_text(TEMPLATE)
    for template in (str(path), TEMPLATE):  # a file, or the text itself
        r = cli("generate", "-p", "hi", "--chat", "--chat-template", template, "--model", plain,
                "--max-tokens", 5, "--kv-cache-memory-bytes", 2**22, "-q")
        assert r.exit_code == 0, r.output
        assert r.stdout == want.outputs[0].text + "\n"
    r = cli("generate", "-p", "hi", "--chat", "--model", plain, "-q")
    assert r.exit_code == 1 and "no chat template" in r.output
    assert "--chat-template" in r.output


def test_run_takes_a_chat_template_for_a_folder_without_one(plain, tmp_path):
    rows = write_jsonl(tmp_path / "in.jsonl", [{"messages": [{"role": "user", "content": "a"}]}])
    r = cli("run", rows, "--model", plain, "--max-tokens", 3, "-q")
    assert r.exit_code == 2 and "no chat template" in r.output
    r = cli("run", rows, "--model", plain, "--max-tokens", 3, "-q", "--chat-template", TEMPLATE,
            "--kv-cache-memory-bytes", 2**22)
    assert r.exit_code == 0, r.output
    r = cli("run", rows, "--model", plain, "--chat-template", "no/such/file.jinja")
    assert r.exit_code == 2 and "no/such/file.jinja" in r.output


@pytest.mark.parametrize(("flag", "hint"), [
    ("--temp", "mlxpa spells it --temperature"), ("--system-prompt", "--system"),
    ("--gpu-memory-utilization", "--kv-memory")])
def test_another_tools_flag_gets_a_hint(flag, hint, tmp_path):
    r = cli("run", tmp_path / "x.jsonl", flag, "1")
    assert r.exit_code == 2 and hint in r.output and len(r.output.splitlines()) == 1


def test_serve_takes_the_model_as_its_argument(plain):
    r = cli("serve", plain, "--model", plain)
    assert r.exit_code == 2 and "give the model once" in r.output


def test_the_developer_role_is_the_system_role():
    from mlxpa.inputs.prompts import parse_messages

    messages, problem = parse_messages([{"role": "developer", "content": "be brief"},
                                        {"role": "user", "content": "hi"}])
    assert problem is None and [m["role"] for m in messages] == ["system", "user"]
