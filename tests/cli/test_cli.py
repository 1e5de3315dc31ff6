"""``mlxpa run`` through Typer's CliRunner on a tiny model folder: formats, stdin/stdout,
per-row errors, metrics JSON; texts checked against mlx-lm's generation on the same model."""

from __future__ import annotations

import json

import mlx.core as mx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mlx_lm.generate import generate_step
from typer.testing import CliRunner

from mlxpa.cli import app
from mlxpa.config import EngineConfig
from mlxpa.loader.models import load_model
from tests.tiny_models import save_tiny_model

PROMPTS = ["hello there", "the cat sat on the mat", "x", "what is 2 + 2?", "zzz" * 10]
METRIC_KEYS = {"requests", "prompt_tokens", "generation_tokens", "elapsed_s",
               "total_tokens_per_s", "output_tokens_per_s", "peak_kv_blocks", "kv_utilization",
               "num_preemptions"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = save_tiny_model(tmp_path_factory.mktemp("m") / "tiny")
    model, tok, _ = load_model(EngineConfig(model=folder))
    refs = []
    for p in PROMPTS:
        ids = [int(t) for t, _ in generate_step(mx.array(tok.encode(p)), model, max_tokens=8)]
        if 1 in ids:  # EOS
            ids = ids[:ids.index(1)]
        refs.append(tok.decode(ids))
    return folder, refs


def invoke(args, input=None):
    result = CliRunner().invoke(app, ["run", *args, "--kv-memory", "0.01"], input=input)
    return result


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_jsonl_to_jsonl_in_order(tiny, tmp_path):
    folder, refs = tiny
    src = write_jsonl(tmp_path / "in.jsonl",
                      [{"id": f"r{i}", "prompt": p} for i, p in enumerate(PROMPTS)])
    out = tmp_path / "out.jsonl"
    r = invoke([src, "-o", str(out), "--model", folder, "--max-tokens", "8",
                "--metrics-json", str(tmp_path / "m.json")])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in rows] == [f"r{i}" for i in range(len(PROMPTS))]
    assert [row["text"] for row in rows] == refs
    assert all(row["prompt_tokens"] == len(PROMPTS[i]) for i, row in enumerate(rows))
    assert all(row["finish_reason"] in ("stop", "length") for row in rows)
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert METRIC_KEYS <= set(metrics)
    assert metrics["requests"] == len(PROMPTS)
    assert metrics["generation_tokens"] == sum(row["completion_tokens"] for row in rows)
    assert metrics["prompt_tokens"] == sum(len(p) for p in PROMPTS)
    assert 0 < metrics["kv_utilization"] <= 1 and metrics["peak_kv_blocks"] >= 1


def test_parquet_in_parquet_out(tiny, tmp_path):
    folder, refs = tiny
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"prompt": PROMPTS, "max_tokens": [8, 8, 0, 8, 8]}), src)
    out = tmp_path / "out.parquet"
    r = invoke([str(src), "-o", str(out), "--model", folder])
    assert r.exit_code == 0, r.output
    table = pq.read_table(out).to_pylist()
    assert [row["id"] for row in table] == [0, 1, 2, 3, 4]
    assert [row["text"] for row in table] == [refs[0], refs[1], "", refs[3], refs[4]]
    assert table[2]["finish_reason"] == "length" and table[2]["completion_tokens"] == 0


def test_stdin_to_stdout_only_results(tiny):
    folder, refs = tiny
    data = "".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:2])
    r = invoke(["-", "--model", folder, "--max-tokens", "8"], input=data)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert [json.loads(line)["text"] for line in lines] == refs[:2]


def test_row_errors_do_not_stop_the_run(tiny, tmp_path):
    folder, refs = tiny
    src = write_jsonl(tmp_path / "in.jsonl", [
        {"prompt": PROMPTS[0]}, {"prompt": ""}, {"prompt": "y" * 5000},
        {"messages": [{"role": "user", "content": "hi"}]}, {"prompt": PROMPTS[1]}])
    out = tmp_path / "out.jsonl"
    r = invoke([src, "-o", str(out), "--model", folder, "--max-tokens", "8"])
    assert r.exit_code == 2 and "2 invalid row(s) of 5" in r.stderr and not out.exists()
    assert "line 4: field \"messages\": this model has no chat template" in r.stderr
    r = invoke([src, "-o", str(out), "--model", folder, "--max-tokens", "8", "--skip-invalid"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in rows] == [0, 1, 2, 3, 4]
    assert rows[0]["text"] == refs[0] and rows[4]["text"] == refs[1]
    assert "line 2" in rows[1]["error"] and "prompt" in rows[1]["error"]
    assert "5000 tokens" in rows[2]["error"] and "line 3" in rows[2]["error"]
    assert "chat template" in rows[3]["error"] and "line 4" in rows[3]["error"]
    assert all(rows[i]["finish_reason"] == "error" for i in (1, 2, 3))


def test_malformed_input_exits_before_model_load(tmp_path, tokenizer_only):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"prompt": "ok"}\n{not json\n')
    r = invoke([str(src), "--model", tokenizer_only])  # no weights: a load would fail
    assert r.exit_code == 2
    assert "bad.jsonl line 2" in r.stderr


def test_bad_option_is_a_clear_error(tiny):
    folder, _ = tiny
    r = invoke(["-", "--model", folder, "--top-p", "0"], input="")
    assert r.exit_code == 2 and "--top-p must be a number in (0, 1], got 0.0" in r.output


def test_plan_predicts_hits_and_blocks(tiny, tmp_path):
    """Hand-computed: block size 4, three prompts sharing 8 tokens (2 blocks)."""
    folder, _ = tiny
    src = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "abcdefgh" + "xy"},
                                             {"prompt": "abcdefgh" + "zw"},
                                             {"prompt": "qrstuvwx"}, {"prompt": ""}])
    r = CliRunner().invoke(app, ["plan", src, "--model", folder, "--block-size", "4",
                                 "--max-tokens", "2", "--json"])
    assert r.exit_code == 2 and f'{src} line 4: field "prompt"' in r.output  # as run lists it
    r = CliRunner().invoke(app, ["plan", src, "--model", folder, "--block-size", "4",
                                 "--max-tokens", "2", "--json", "--skip-invalid"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.stdout)
    assert p["rows"] == 3 and p["invalid_rows"] == 1
    assert p["prompt_tokens"] == 28
    # Second "abcdefgh.." row reuses 2 blocks (8 tokens); "qrstuvwx" shares nothing.
    assert p["computed_prompt_tokens"] == 20
    assert p["predicted_hit_rate"] == pytest.approx(8 / 28)
    # Without sharing: cdiv(12, 4) * 2 + cdiv(10, 4) = 3 + 3 + 3 = 9 blocks.
    assert p["kv_blocks_without_sharing"] == 9
    # With sharing: tree holds abcd, efgh, qrst, uvwx = 4 blocks; tails: (3-2) + (3-2) + (3-2).
    assert p["kv_blocks_with_sharing"] == 7
    assert p["shared_prefixes"][0]["num_tokens"] == 8 and p["shared_prefixes"][0]["num_rows"] == 2


def test_output_over_input_is_refused(tmp_path):
    src = write_jsonl(tmp_path / "same.jsonl", [{"prompt": "hi"}])
    r = CliRunner().invoke(app, ["run", src, "-o", src])
    assert r.exit_code == 2 and "destroy the input" in r.output
    assert json.loads(open(src).read()) == {"prompt": "hi"}


def test_plan_takes_run_s_input_options(tiny, tmp_path):
    """`plan --system` predicts what `run --system` feeds the engine: the same plan as a file
    with the system text written before every prompt (and more sharing than without it)."""
    folder, _ = tiny
    rows = [{"q": "abcdefgh"}, {"q": "qrstuvwx"}, {"q": "ijklmnop"}]
    src = write_jsonl(tmp_path / "p.jsonl", rows)
    written = write_jsonl(tmp_path / "w.jsonl",
                          [{"q": "Answer briefly.\n\n" + r["q"]} for r in rows])

    def plan(path, *extra):
        r = CliRunner().invoke(app, ["plan", path, "--model", folder, "--block-size", "8",
                                     "--prompt-column", "q", "--json", *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    with_system = plan(src, "--system", "Answer briefly.")
    assert with_system == plan(written)
    assert with_system["computed_prompt_tokens"] < with_system["prompt_tokens"]
    assert plan(src)["predicted_hit_rate"] == 0
