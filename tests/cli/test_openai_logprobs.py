"""OpenAI Batch output's ``logprobs``: a ``/v1/completions`` line gets OpenAI's completions
shape (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``), checked against a
hand-built object from the tiny model's own teacher-forced log-softmax."""

from __future__ import annotations

import mlx.core as mx

from tests.cli.test_run_cli import PROMPT, invoke, read_jsonl, tiny, write_jsonl  # noqa: F401


def expected_completions_logprobs(model, tok, prompt_ids, out_ids, k):
    """The completions logprobs object built by hand from one forward pass."""
    logits = model(mx.array(prompt_ids + out_ids)[None])[0].astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    tokens, values, tops, offsets, pos = [], [], [], [], 0
    for j, t in enumerate(out_ids):
        row = lp[len(prompt_ids) - 1 + j]
        text = tok.decode([t])
        tokens.append(text)
        values.append(row[t].item())
        best = mx.argsort(-row)[:k].tolist()
        tops.append({tok.decode([b]): row[b].item() for b in best})
        offsets.append(pos)
        pos += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
            "text_offset": offsets}


def close(got, want) -> bool:
    if isinstance(want, dict):
        return set(got) == set(want) and all(close(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return len(got) == len(want) and all(close(g, w) for g, w in zip(got, want))
    if isinstance(want, float):
        return abs(got - want) < 1e-3
    return got == want


def test_completions_line_gets_the_completions_shape(tmp_path, tiny):  # noqa: F811
    from mlxpa.config import EngineConfig
    from mlxpa.loader.models import load_model

    folder, tok, ref = tiny
    model, _, _ = load_model(EngineConfig(model=folder))
    src = write_jsonl(tmp_path / "batch.jsonl", [
        {"custom_id": "c", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": PROMPT, "max_tokens": 6, "logprobs": 2, "ignore_eos": True}}])
    out = tmp_path / "out.jsonl"
    r = invoke([src, "-o", str(out), "--model", folder])
    assert r.exit_code == 0, r.output
    (line,) = read_jsonl(out)
    choice = line["response"]["body"]["choices"][0]
    want = expected_completions_logprobs(model, tok, tok.encode(PROMPT), ref[:6], 2)
    assert close(choice["logprobs"], want), (choice["logprobs"], want)
    assert "".join(want["tokens"]) == choice["text"]
