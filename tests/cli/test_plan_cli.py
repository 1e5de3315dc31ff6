"""``mlxpa plan`` on the tiny model's tokenizer alone (a folder without weights): the
predicted blocks with n samples and the context clamp, rows over the context named, invalid
rows listed as ``run`` lists them."""

from __future__ import annotations

import json

from tests.cli.helpers import ROBOT, cli, write_jsonl


def plan_json(src, model, *more):
    r = cli("plan", src, "--model", model, "--json", *more)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), r.stderr



def test_plan_counts_n_samples_per_row(tmp_path, tokenizer_only):
    """40 byte tokens + 20 outputs = 4 blocks of 16 per sample, 4 samples: 16 blocks without
    sharing; with sharing the 2 full prompt blocks are held once: 2 + 4 * 2 = 10."""
    src = write_jsonl(tmp_path / "n.jsonl", [{"prompt": "x" * 40, "n": 4, "max_tokens": 20}])
    p, _ = plan_json(src, tokenizer_only)
    assert (p["kv_blocks_without_sharing"], p["kv_blocks_with_sharing"]) == (16, 10)



def test_plan_clamps_max_tokens_and_names_rows_over_the_context(tmp_path, tokenizer_only):
    """The tiny model's context is 4096 tokens: "hello" (5 tokens) with max_tokens 1e11 holds
    4096 tokens = 256 blocks, as run clamps it; a 5000-token prompt is named, not planned."""
    src = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "hello", "max_tokens": 10**11},
                                             {"id": "long", "prompt": "y" * 5000}])
    p, err = plan_json(src, tokenizer_only)
    assert p["kv_blocks_without_sharing"] == 256
    assert (p["rows"], p["over_context_rows"]) == (1, 1)
    assert p["over_context"] == [f"{src} line 2: prompt has 5000 tokens; the limit is 4095 "
                                 "(the model context (--max-model-len) holds 4096 tokens)"]
    assert "warning: 1 row(s) over the context" in err
    p, _ = plan_json(src, tokenizer_only, "--max-model-len", 100)
    assert p["kv_blocks_without_sharing"] == 7  # ceil(100 / 16)



def test_plan_lists_invalid_rows_and_exits_2(tmp_path, tokenizer_only):
    src = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "hello"}, ROBOT])
    r = cli("plan", src, "--model", tokenizer_only)
    assert r.exit_code == 2, r.output
    assert f"{src}: 1 invalid row(s) of 2; nothing was planned (--skip-invalid plans " in r.stderr
    assert f'{src} line 2: field "messages": the chat template rejected them' in r.stderr
    assert "error row" not in r.stderr
    p, _ = plan_json(src, tokenizer_only, "--skip-invalid")
    assert (p["rows"], p["invalid_rows"]) == (1, 1)



def test_an_invalid_file_is_refused_before_the_tokenizer_loads(tmp_path, tokenizer_only,
                                                               monkeypatch):
    from mlxpa.batch.model_meta import ModelMeta

    loads = []
    real = ModelMeta.tokenizer
    monkeypatch.setattr(ModelMeta, "tokenizer", lambda self: loads.append(1) or real(self))
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "a"}, {"prompt": ""}])
    r = cli("plan", src, "--model", tokenizer_only)
    assert r.exit_code == 2 and 'field "prompt" must be a non-empty string' in r.output
    assert loads == []  # the cheap checks first (as run: in a second, not a model load)
    ok = write_jsonl(tmp_path / "ok.jsonl", [{"prompt": "a"}])
    assert cli("plan", ok, "--model", tokenizer_only).exit_code == 0 and loads
