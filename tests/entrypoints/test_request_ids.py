"""A prompt's request id in ``LLM``: its ``id`` field, else its index in the call; unique per
call, refused as ``mlxpa run`` refuses the same rows (oracle: ``run_file`` on the same rows as
a JSONL file). An unseeded sampled prompt's tokens depend on that id (with the engine seed),
not on its position: the same id gives the same tokens alone, elsewhere in a call, and in a
file run."""

from __future__ import annotations

import json
import re

import pytest

from mlxpa import SamplingParams
from mlxpa.batch.run import RunOptions, run_file
from mlxpa.config import EngineConfig
from mlxpa.data import InputError
from tests.entrypoints.conftest import KV_BYTES

PROMPT = "the cat sat on the mat"
HOT = SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True)  # unseeded


def _tokens(outs) -> dict[str, list[int]]:
    return {o.request_id: o.outputs[0].token_ids for o in outs}


def test_an_unseeded_prompts_tokens_follow_its_id_not_its_position(llm, folder, tmp_path):
    three = _tokens(llm.generate([PROMPT] * 3, HOT, use_tqdm=False))
    assert list(three) == ["0", "1", "2"] and len({tuple(t) for t in three.values()}) > 1
    moved = _tokens(llm.generate([{"id": "x", "prompt": "other"}, {"id": "1", "prompt": PROMPT},
                                  {"id": "y", "prompt": PROMPT}], HOT, use_tqdm=False))
    assert moved["1"] == three["1"]  # index 1 then, position 1 of three rows now
    alone = _tokens(llm.generate({"id": 2, "prompt": PROMPT}, HOT, use_tqdm=False))
    assert alone == {"2": three["2"]}
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "new", "prompt": PROMPT}, {"id": 0, "prompt": PROMPT}, {"prompt": PROMPT}]))
    run_file(str(src), str(out), EngineConfig(model=folder, kv_cache_memory_bytes=KV_BYTES),
             HOT, RunOptions(show_progress=False))
    texts = {r["id"]: r["text"] for r in map(json.loads, out.read_text().splitlines())}
    decode = llm.get_tokenizer().decode
    assert texts[0] == decode(three["0"]) and texts[2] == decode(three["2"])  # row 2: no id


@pytest.mark.parametrize(("rows", "refused", "first"), [
    ([{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}], 1, 0),
    ([{"id": 7, "prompt": "x"}, {"id": "7", "prompt": "y"}], 1, 0),  # 7 and "7": one id
    ([{"id": 1, "prompt": "x"}, {"prompt": "y"}], 1, 0),  # prompt 1's id is its index
    ([{"prompt": "x"}, {"prompt": "y"}, {"id": 0, "prompt": "z"}], 2, 0),
    ([{"prompt": "x"}, {"prompt": "y"}, {"id": "b", "prompt": "z"}, {"id": 1, "prompt": "w"}],
     3, 1),
], ids=["repeated", "int-and-text", "id-is-a-later-index", "id-is-an-earlier-index",
        "after-another"])
def test_ids_are_unique_per_call_as_in_mlxpa_run(llm, folder, tmp_path, rows, refused, first):
    want = (f"prompts[{refused}]: duplicate id {json.dumps(str(_id(rows, refused)))} (first at "
            f"prompts[{first}]; a prompt's id is its \"id\" field, else its index)")
    with pytest.raises(ValueError, match=f"^{re.escape(want)}$"):
        llm.generate(rows, use_tqdm=False)
    plain = [r.get("prompt") for r in rows]  # a string prompt has its index as id too
    if all("id" not in r for r in rows[:refused]) and "id" in rows[refused]:
        with pytest.raises(ValueError, match=re.escape(f"prompts[{refused}]: duplicate id")):
            llm.generate([*plain[:refused], rows[refused]], use_tqdm=False)
    outs = list(llm.generate_iter(rows, SamplingParams(max_tokens=2)))
    assert [o.error is not None for o in outs] == [i == refused for i in range(len(rows))]
    assert outs[refused].error == want and outs[refused].outputs == []
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError) as e:  # mlxpa run refuses the same row (line = index + 1)
        run_file(str(src), str(tmp_path / "out.jsonl"), EngineConfig(model=folder),
                 SamplingParams(), RunOptions(show_progress=False))
    assert f"{src} line {refused + 1}: duplicate id" in str(e.value)
    assert f"(first at line {first + 1})" in str(e.value)


def test_distinct_ids_run(llm):
    rows = [{"id": "0", "prompt": "x"}, {"id": "01", "prompt": "y"}, "z", {"id": 3}]
    rows[3]["prompt"] = "w"  # its own index as id: no clash
    outs = llm.generate(rows, SamplingParams(max_tokens=2), use_tqdm=False)
    assert [o.request_id for o in outs] == ["0", "01", "2", "3"]
    assert all(o.error is None for o in outs)


def _id(rows: list[dict], i: int):
    return rows[i].get("id", i)
