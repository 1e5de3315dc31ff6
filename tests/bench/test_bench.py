"""``mlxpa bench`` on a tiny model: every workload and system, figures present and positive,
identical generated token counts across systems, JSON schema, plot written."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mlxpa.bench.workloads import random_workload, shared_prefix_workload
from mlxpa.cli import app
from mlxpa.config import EngineConfig
from mlxpa.loader.models import load_model
from tests.tiny_models import save_tiny_model

SYSTEMS = ["mlxpa", "mlxpa-noprefix", "mlx-lm", "static"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("m") / "tiny", kind="gemma3")


def test_workload_shapes(folder):
    _, tok, _ = load_model(EngineConfig(model=folder))
    wl = random_workload(tok, num_prompts=20, input_len=10, output_len=3, range_ratio=0.5)
    assert len(wl.prompts) == 20 and wl.output_lens == [3] * 20
    assert all(5 <= len(p) <= 15 for p in wl.prompts)
    special = set(tok.all_special_ids)
    assert all(p[0] == tok.bos_token_id for p in wl.prompts)  # a BOS, as a real prompt has
    assert not any(t in special for p in wl.prompts for t in p[1:])
    sp = shared_prefix_workload(tok, num_groups=3, prompts_per_group=4, system_prompt_len=12,
                                question_len=5, output_len=2)
    assert len(sp.prompts) == 12 and all(len(p) == 17 for p in sp.prompts)
    # Row i belongs to group i % 3: same 12-token prefix, different questions.
    assert sp.prompts[0][:12] == sp.prompts[3][:12] != sp.prompts[1][:12]
    assert sp.prompts[0][12:] != sp.prompts[3][12:]


@pytest.mark.parametrize("workload,args", [
    ("random", ["--num-prompts", "6", "--input-len", "20", "--output-len", "5"]),
    ("shared-prefix", ["--num-groups", "2", "--prompts-per-group", "3",
                       "--system-prompt-len", "24", "--question-len", "6", "--output-len", "4"]),
])
def test_bench_all_systems(folder, tmp_path, workload, args):
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    r = CliRunner().invoke(app, ["bench", "--model", folder, "--workload", workload, *args,
                                 "--kv-memory", "0.01", "--json", str(out_json),
                                 "--plot", str(out_png)])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("Throughput: ")
    data = json.loads(out_json.read_text())
    assert set(data) == {"workload", "machine", "systems"}
    assert set(data["systems"]) == set(SYSTEMS)
    assert {"cpu", "cores", "memory_bytes", "mlx", "mlx_lm", "dtype", "date", "blas"} <= set(
        data["machine"])
    expected = data["workload"]["output_tokens"]
    for name, f in data["systems"].items():
        assert f["generation_tokens"] == expected, name
        for key in ("requests_per_s", "total_tokens_per_s", "output_tokens_per_s",
                    "peak_memory_bytes"):
            assert f[key] > 0, (name, key)
        for other in SYSTEMS:
            if other != name:
                assert f[f"total_tokens_per_s_ratio_to_{other}"] > 0
    for name in ("mlxpa", "mlxpa-noprefix", "static"):
        assert data["systems"][name]["kv_bytes"] > 0
        assert data["systems"][name]["ttft_p50_s"] > 0
    if workload == "shared-prefix":
        # 6 prompts of 30 tokens; 4 reuse the group's one full 16-token block.
        assert data["systems"]["mlxpa"]["prefix_cache_hit_rate"] == pytest.approx(64 / 180)
        assert data["systems"]["mlxpa-noprefix"]["prefix_cache_hit_rate"] == 0
    assert out_png.stat().st_size > 1000


def test_bench_file_workload_and_bad_system(folder, tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text('{"prompt": "hello"}\n{"prompt": "world!"}\n')
    r = CliRunner().invoke(app, ["bench", "--model", folder, "--workload", "file", "--input",
                                 str(src), "--output-len", "3", "--baselines", "mlxpa,static"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["bench", "--model", folder, "--baselines", "vllm"])
    assert r.exit_code == 1 and "unknown system" in r.stderr


def test_bench_progress_bars_go_to_stderr_only(folder, tmp_path):
    """A bar per timed system, each counting every output token of the workload (the oracle:
    its token count), on stderr; stdout is the throughput line alone; --quiet drops the bars,
    not the results."""
    args = ["bench", "--model", folder, "--num-prompts", "4", "--input-len", "12",
            "--output-len", "5", "--kv-memory", "0.01", "--baselines", "mlxpa,mlx-lm,static"]
    r = CliRunner().invoke(app, [*args, "--json", str(tmp_path / "a.json")])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("Throughput: ") and r.stdout.count("\n") == 1
    total = json.loads((tmp_path / "a.json").read_text())["workload"]["output_tokens"]
    assert total == 20
    bars = [line for line in r.stderr.splitlines() if " tokens " in line]
    assert [line.split()[:2] for line in bars] == [
        ["warm-up", "(2"], ["[1/3]", "mlxpa"], ["[2/3]", "mlx-lm"], ["[3/3]", "static"]]
    assert all(f" {total}/{total} tokens " in line for line in bars[1:])
    assert all(line.rstrip().endswith(" total tok/s") for line in bars[1:])
    assert " 24/24 tokens " in bars[0]  # 3 systems x 2 prompts x 4 tokens
    q = CliRunner().invoke(app, [*args, "--quiet", "--json", str(tmp_path / "q.json")])
    assert q.exit_code == 0, q.output
    assert " tokens " not in q.stderr and q.stdout.startswith("Throughput: ")
    for name in ("mlxpa", "mlx-lm", "static"):
        assert f"│ {name} " in r.stderr and f"│ {name} " in q.stderr
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "aq")
    assert a["workload"] == b["workload"] and set(a["systems"]) == set(b["systems"])
    assert all(set(a["systems"][s]) == set(b["systems"][s]) for s in a["systems"])
    assert all(a["systems"][s]["generation_tokens"] == total for s in a["systems"])


def test_bench_nocascade_system_and_decode_phase(folder, tmp_path):
    """The shared-prefix workload against mlxpa-nocascade: both generate every token, both
    report a decode-phase rate (steps that only decode), and the cascade line gives the
    ratios."""
    out_json = tmp_path / "c.json"
    r = CliRunner().invoke(app, ["bench", "--model", folder, "--workload", "shared-prefix",
                                 "--num-groups", "2", "--prompts-per-group", "4",
                                 "--system-prompt-len", "40", "--question-len", "6",
                                 "--output-len", "6", "--kv-memory", "0.01", "--baselines",
                                 "mlxpa,mlxpa-nocascade,mlx-lm", "--json", str(out_json)])
    assert r.exit_code == 0, r.output
    data = json.loads(out_json.read_text())
    systems = data["systems"]
    assert set(systems) == {"mlxpa", "mlxpa-nocascade", "mlx-lm"}
    for name in ("mlxpa", "mlxpa-nocascade"):
        f = systems[name]
        assert f["generation_tokens"] == 48
        # Every request decodes 5 of its 6 tokens in steps that only decode (its first comes
        # from its prefill), once all prefills are done.
        assert 0 < f["decode_steps"] <= 6 and f["decode_output_tokens_per_s"] > 0
    assert systems["mlx-lm"].get("decode_output_tokens_per_s") is None
    ratio = systems["mlxpa"]["decode_output_tokens_per_s_ratio_to_mlxpa-nocascade"]
    assert ratio == pytest.approx(systems["mlxpa"]["decode_output_tokens_per_s"]
                                  / systems["mlxpa-nocascade"]["decode_output_tokens_per_s"])
    assert f"decode-phase output tok/s {ratio:.2f}x" in " ".join(r.stderr.split())


def test_no_cascade_attention_reaches_the_engine(folder, monkeypatch):
    from mlxpa.bench import systems

    seen = []
    monkeypatch.setitem(systems.SYSTEMS, "mlxpa", lambda m, t, wl, config, advance: seen.append(
        not config.disable_cascade_attn) or systems.run_mlxpa(m, t, wl, config, advance))
    for flags, want in ((["--disable-cascade-attn"], False), ([], True)):
        seen.clear()
        r = CliRunner().invoke(app, ["bench", "--model", folder, "--num-prompts", "2",
                                     "--input-len", "8", "--output-len", "2", "--kv-memory",
                                     "0.01", "--baselines", "mlxpa", *flags])
        assert r.exit_code == 0, r.output
        assert seen and set(seen) == {want}


def test_repeats_keep_each_run_in_rotating_order(folder, monkeypatch):
    """With ``repeats > 1`` each system's figures keep every timed run (its place in the
    sequence and headline figures): the order rotates (mlxpa first, then second, then
    first), the medians are those of the runs, and one repeat adds no ``runs``."""
    from mlxpa.bench import systems

    model, tok, _ = load_model(EngineConfig(model=folder))
    wl = random_workload(tok, 2, 8, 2, 0.0)
    config = EngineConfig(kv_cache_memory_bytes=2**30 // 100)
    place = iter(range(1, 100))
    real = dict(systems.SYSTEMS)

    def timed(name):
        def run(m, t, w, c, advance):   # a real run, its time set to total tok/s = 10 x place
            result = real[name](m, t, w, c, advance)
            if w is wl:                 # a timed run, not the warm-up
                tokens = result.prompt_tokens + result.generation_tokens
                result.elapsed_s = tokens / (10.0 * next(place))
            return result
        return run

    for name in ("mlxpa", "mlxpa-nocascade"):
        monkeypatch.setitem(systems.SYSTEMS, name, timed(name))
    figures, _ = systems.run_bench(model, tok, wl, config, ("mlxpa", "mlxpa-nocascade"),
                                   repeats=3)
    mine, other = figures["mlxpa"], figures["mlxpa-nocascade"]
    assert [r["run"] for r in mine["runs"]] == [1, 4, 5]
    assert [r["run"] for r in other["runs"]] == [2, 3, 6]
    assert [r["total_tokens_per_s"] for r in mine["runs"]] == pytest.approx([10, 40, 50])
    assert mine["total_tokens_per_s"] == pytest.approx(40.0)
    assert other["total_tokens_per_s"] == pytest.approx(30.0)
    assert mine["total_tokens_per_s_ratio_to_mlxpa-nocascade"] == pytest.approx(40 / 30)
    assert set(mine["runs"][0]) == {"run", *systems.RUN_KEYS}
    assert all(r["decode_output_tokens_per_s"] > 0 for r in mine["runs"])
    once, _ = systems.run_bench(model, tok, wl, config, ("mlxpa",), warmup=False)
    assert "runs" not in once["mlxpa"]
