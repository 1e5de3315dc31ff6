"""The disk KV tier end to end on tiny models (a full-attention llama, a Gemma 3 layout with
sliding windows, Qwen 3.5 and LFM2 hybrids whose hits resume from recurrent snapshots):
greedy tokens identical, and log-probabilities within 1e-4, with no hit, memory hits and
disk hits read by a new engine (mlx-lm's own generation the oracle); bit-flipped files (a
snapshot's bytes among them) are never used; a folder that refuses writes loses no row; a
state-space model without K/V runs without the tier."""

from __future__ import annotations

import errno
import os

import pytest

from mlxpa.config import EngineConfig
from mlxpa.core import disk_cache
from mlxpa.core.disk_folder import list_files
from mlxpa.engine import LLMEngine
from mlxpa.engine.metrics import summarize
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from tests.engine.test_llm_engine import mlx_lm_greedy
from tests.tiny_models import byte_tokenizer, tiny_gemma3, tiny_llama

BS = 8
SHARED = "You are a careful annotator. Answer briefly and well, as the examples do. " * 2
PROMPTS = [SHARED + f"Q: item {i} please" for i in range(4)]  # 152 shared tokens: 19 blocks
OUT = 8
N = 152 // BS


@pytest.fixture(scope="module", params=["llama", "gemma3_sliding"])
def setup(request):
    model = tiny_llama() if request.param == "llama" else tiny_gemma3(sliding_window=8,
                                                                       num_layers=6)
    tok = byte_tokenizer(eos_id=-1)
    ids = [tok.encode(p) for p in PROMPTS]
    return model, tok, ids, [mlx_lm_greedy(model, p, OUT) for p in ids]


def run(model, tok, ids, **config):
    cfg = EngineConfig(block_size=BS, num_blocks=128, max_num_seqs=4,
                       max_num_batched_tokens=64, **config)
    eng = LLMEngine(cfg, model, tok)
    params = SamplingParams(max_tokens=OUT, logprobs=2)
    outs = {o.request_id: o for o in eng.generate(
        EngineRequest(str(i), p, params) for i, p in enumerate(ids))}
    eng.write_back()
    eng.kv_cache_manager.check_invariants([])
    return eng, [outs[str(i)] for i in range(len(ids))]


def same(outs, refs, cold) -> None:
    assert [o.token_ids for o in outs] == refs
    for o, c in zip(outs, cold):
        for a, b in zip(o.logprobs, c.logprobs):
            assert a.token_id == b.token_id and abs(a.logprob - b.logprob) < 1e-4


def test_disk_hits_give_the_tokens_of_a_cold_run(setup, tmp_path):
    model, tok, ids, refs = setup
    _, cold = run(model, tok, ids)
    first, outs = run(model, tok, ids, kv_cache_dir=str(tmp_path))
    same(outs, refs, cold)
    c = first.counters
    assert c.cached_prompt_tokens == 3 * N * BS and c.disk_cached_prompt_tokens == 0
    assert c.disk_blocks_written == N  # the shared blocks the hits read, not the rows' own
    second, outs = run(model, tok, ids, kv_cache_dir=str(tmp_path))  # a new engine: disk
    same(outs, refs, cold)
    c = second.counters
    assert c.cached_prompt_tokens == 4 * N * BS and c.disk_cached_prompt_tokens == N * BS
    assert c.disk_blocks_read == N and c.disk_blocks_written == 0
    stats = summarize(c)
    assert stats.kv_disk["files"] == N and stats.disk_cached_prompt_tokens == N * BS


def test_bit_flipped_files_are_computed_instead(setup, tmp_path):
    model, tok, ids, refs = setup
    run(model, tok, ids, kv_cache_dir=str(tmp_path))
    files = list_files(tmp_path)
    for f in files:
        with open(f.path, "r+b") as fh:
            fh.seek(f.nbytes // 2)
            byte = fh.read(1)
            fh.seek(f.nbytes // 2)
            fh.write(bytes([byte[0] ^ 0x10]))
    eng, outs = run(model, tok, ids, kv_cache_dir=str(tmp_path))
    assert [o.token_ids for o in outs] == refs
    c = eng.counters  # block 0's file, and the next one a later lookup reached, removed
    assert c.disk_cached_prompt_tokens == 0 and c.disk_invalid_files >= 1
    assert c.disk_blocks_written == c.disk_invalid_files  # written again by this run
    eng, outs = run(model, tok, ids, kv_cache_dir=str(tmp_path))  # good and bad files
    assert [o.token_ids for o in outs] == refs
    assert eng.counters.disk_cached_prompt_tokens < N * BS  # only what verifies, usable


def test_a_folder_that_refuses_writes_loses_no_row(setup, tmp_path, monkeypatch):
    model, tok, ids, refs = setup

    def refuse(path, data):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(disk_cache, "atomic_write", refuse)
    with pytest.warns(RuntimeWarning, match="stops writing: Read-only") as caught:
        eng, outs = run(model, tok, ids, kv_cache_dir=str(tmp_path))
    assert len([w for w in caught if "KV disk cache" in str(w.message)]) == 1
    assert [o.token_ids for o in outs] == refs
    assert eng.counters.disk_blocks_written == 0


def test_an_unusable_folder_runs_without_the_tier(setup, tmp_path):
    model, tok, ids, refs = setup
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.warns(RuntimeWarning, match="KV disk cache is off"):
        eng, outs = run(model, tok, ids, kv_cache_dir=str(blocker / "kv"))
    assert eng.disk_store is None and [o.token_ids for o in outs] == refs


@pytest.fixture(scope="module", params=["qwen3_5", "lfm2"])
def hybrid(request):
    """A tiny Qwen 3.5 (gated-delta layers with a recurrent state, full attention every
    second layer) or LFM2 (short convolutions and attention)."""
    from tests.loader.tiny_archs import build

    model, tok = build(request.param), byte_tokenizer(eos_id=-1)
    ids = [tok.encode(p) for p in PROMPTS]
    return model, tok, ids, [mlx_lm_greedy(model, p, OUT) for p in ids]


def test_a_hybrid_model_resumes_from_a_snapshot_read_from_disk(hybrid, tmp_path):
    """The first run keeps the shared prefix's blocks and the snapshot at its end; a new
    engine reads both and every row resumes there (the first from disk, the rest from
    memory), with the tokens and log-probabilities of a cold run."""
    model, tok, ids, refs = hybrid
    cold_engine, cold = run(model, tok, ids)
    assert [o.token_ids for o in cold] == refs
    first, outs = run(model, tok, ids, kv_cache_dir=str(tmp_path))
    assert first.kv_cache_manager.disk is not None and first.kv_cache_manager.recurrent
    same(outs, refs, cold)
    c = first.counters
    assert c.cached_prompt_tokens == cold_engine.counters.cached_prompt_tokens == 3 * N * BS
    assert c.disk_blocks_written == N and c.disk_snapshots_written == 1
    snapshot = first.runner.kv_storage.snapshot_bytes
    assert first.disk_store.snapshot_nbytes == snapshot > 0
    assert c.disk_bytes_written == sum(f.nbytes for f in list_files(tmp_path))
    second, outs = run(model, tok, ids, kv_cache_dir=str(tmp_path))
    same(outs, refs, cold)
    c = second.counters
    assert [o.num_cached_tokens for o in outs] == [N * BS] * 4
    assert c.cached_prompt_tokens == 4 * N * BS and c.disk_cached_prompt_tokens == N * BS
    assert (c.disk_blocks_read, c.disk_snapshots_read, c.disk_blocks_written) == (N, 1, 0)
    assert summarize(c).kv_disk["snapshots_read"] == 1


def test_a_bit_flipped_snapshot_is_computed_instead(hybrid, tmp_path):
    """The snapshot's bytes of the prefix's last file flipped: that file is removed, no hit
    comes from disk (no other position has a snapshot), the prefix is computed again, with
    the tokens and log-probabilities of a cold run, and written again."""
    model, tok, ids, refs = hybrid
    _, cold = run(model, tok, ids)
    first, _ = run(model, tok, ids, kv_cache_dir=str(tmp_path))
    snapshot = first.disk_store.snapshot_nbytes
    flipped = 0
    for f in list_files(tmp_path):
        with open(f.path, "rb") as fh:
            data = bytearray(fh.read())
        if b'"snapshot":1' in data:  # the snapshot's bytes end before the digest
            data[len(data) - 32 - snapshot // 2] ^= 0x10
            with open(f.path, "wb") as fh:
                fh.write(data)
            flipped += 1
    assert flipped == 1
    eng, outs = run(model, tok, ids, kv_cache_dir=str(tmp_path))
    same(outs, refs, cold)
    c = eng.counters
    assert c.disk_invalid_files == 1 and c.disk_cached_prompt_tokens == 0
    assert c.cached_prompt_tokens == 3 * N * BS  # memory hits after the first row's prefix
    assert c.disk_snapshots_written == 1  # the prefix's last position, computed again
    eng, outs = run(model, tok, ids, kv_cache_dir=str(tmp_path))
    same(outs, refs, cold)
    assert eng.counters.disk_cached_prompt_tokens == N * BS


def test_a_model_without_kv_runs_without_the_tier(tmp_path):
    from tests.loader.tiny_archs import build

    model, tok = build("mamba2"), byte_tokenizer(eos_id=-1)
    ids = [tok.encode(p) for p in PROMPTS[:2]]
    refs = [mlx_lm_greedy(model, p, OUT) for p in ids]
    for _ in range(2):
        eng, outs = run(model, tok, ids, kv_cache_dir=str(tmp_path))
        assert eng.kv_cache_manager.disk is None
        assert [o.token_ids for o in outs] == refs
    assert not list_files(tmp_path) and os.path.isdir(tmp_path)


def test_a_restarted_server_engine_reads_what_it_shared(tmp_path):
    """AsyncLLM writes back on shutdown; the next one's first request reads the prefix from
    disk and gets the same text as a cold engine."""
    import asyncio

    from mlxpa.engine.async_llm import AsyncLLM

    tok = byte_tokenizer()  # the engine thread builds the grammar tokenizer: a real EOS
    config = EngineConfig(block_size=BS, num_blocks=128, max_num_batched_tokens=64,
                          kv_cache_dir=str(tmp_path))
    ids = [tok.encode(p) for p in PROMPTS]

    async def ask(llm, i):
        outs = [o async for o in llm.generate(EngineRequest(str(i), ids[i], SamplingParams(
            max_tokens=OUT, ignore_eos=True)))]
        return outs[-1]

    def serve(indices):
        llm = AsyncLLM(config, engine_factory=lambda: LLMEngine(config, tiny_llama(), tok))
        llm.start()
        try:
            return [asyncio.run(ask(llm, i)) for i in indices], llm
        finally:
            llm.shutdown()

    (a, b), _ = serve([0, 1])  # one after the other: the second hits the first's prefix
    assert b.num_cached_tokens == N * BS and list_files(tmp_path)
    (c,), llm = serve([2])
    assert c.num_cached_tokens == N * BS and llm.stats.counters.disk_cached_prompt_tokens == N * BS
    assert c.token_ids == mlx_lm_greedy(tiny_llama(), ids[2], OUT)
