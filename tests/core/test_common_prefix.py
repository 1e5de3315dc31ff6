"""Tests for mlxpa.core.common_prefix (cascade attention's groups) and the scheduler's
``SchedulerOutput.cascade_groups``: exact groups for hand-built block tables, the partition's
saving against an exhaustive search over every partition of small batches, and the groups a
real scheduler step reports for requests that share a prompt prefix through the radix tree
and through forks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mlxpa.config import EngineConfig
from mlxpa.core.block_pool import BlockPool
from mlxpa.core.common_prefix import CascadeGroup, common_prefix_groups
from mlxpa.core.kv_cache_manager import KVCacheManager
from mlxpa.core.scheduler import Scheduler
from mlxpa.request import Request
from mlxpa.sampling_params import SamplingParams


def test_no_sharing_no_groups():
    assert common_prefix_groups([[1, 2], [3, 4], [5]], [2, 2, 1]) == []
    assert common_prefix_groups([], []) == []
    assert common_prefix_groups([[1, 2]], [2]) == []


def test_two_documents_each_shared_by_its_questions():
    tables = [[1, 2, 3, 10], [4, 5, 20], [1, 2, 3, 11], [4, 5, 21], [1, 2, 3, 12, 13]]
    full = [4, 3, 4, 3, 4]
    assert common_prefix_groups(tables, full) == [CascadeGroup((0, 2, 4), 3),
                                                  CascadeGroup((1, 3), 2)]


def test_only_full_blocks_count():
    # Rows 0 and 1 hold the same block 7 at position 2, but row 1 has written only two
    # full blocks (its query sits in block 7): the group shares two.
    tables = [[1, 2, 7, 9], [1, 2, 7]]
    assert common_prefix_groups(tables, [3, 2]) == [CascadeGroup((0, 1), 2)]
    # A row with no full block joins nothing.
    assert common_prefix_groups([[1, 2], [1]], [2, 0]) == []


def test_deeper_pair_beats_a_shallow_crowd_and_vice_versa():
    # Three rows share one block (saves 2 x 1); two of them share 10 (saves 1 x 10).
    deep = list(range(1, 11))
    tables = [deep + [50], deep + [51], [1, 60]]
    assert common_prefix_groups(tables, [11, 11, 2]) == [CascadeGroup((0, 1), 10)]
    # Forty rows share two blocks (saves 39 x 2); two of them share three (saves 1 x 3).
    tables = [[1, 2, 3, 100], [1, 2, 3, 101]] + [[1, 2, 200 + i] for i in range(38)]
    got = common_prefix_groups(tables, [len(t) for t in tables])
    assert got == [CascadeGroup(tuple(range(40)), 2)]


def test_nested_split_into_subgroups():
    # Block 1 is common to all six; then two families of three share three blocks each:
    # one group at depth 1 saves 5; two groups at depth 3 save 2 x (2 x 3) = 12.
    a, b = [1, 2, 3], [1, 4, 5]
    tables = [a + [10], b + [11], a + [12], b + [13], a + [14], b + [15]]
    assert common_prefix_groups(tables, [4] * 6) == [CascadeGroup((0, 2, 4), 3),
                                                     CascadeGroup((1, 3, 5), 3)]


def test_samples_of_questions_on_one_document_form_one_group():
    # Three questions on a 4-block document, two samples each (forks): the samples of a
    # question share 5 blocks, all six share 4. One group saves 5 x 4 = 20, three pairs 15.
    doc = [1, 2, 3, 4]
    tables = [doc + [10 + q, 20 + 2 * q + s] for q in range(3) for s in range(2)]
    assert common_prefix_groups(tables, [5] * 6) == [CascadeGroup(tuple(range(6)), 4)]


def _saved(groups: list[CascadeGroup]) -> int:
    return sum((len(g.indices) - 1) * g.num_blocks for g in groups)


def _lcp(prefixes: list[list[int]]) -> int:
    n = 0
    while all(len(p) > n for p in prefixes) and len({p[n] for p in prefixes}) == 1:
        n += 1
    return n


def _partitions(items: list[int]):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        yield [[first]] + part
        for k in range(len(part)):
            yield part[:k] + [[first] + part[k]] + part[k + 1:]


def _best_by_exhaustion(tables: list[list[int]], full: list[int]) -> int:
    prefixes = [t[:f] for t, f in zip(tables, full)]
    return max(sum((len(block) - 1) * _lcp([prefixes[i] for i in block])
                   for block in part if len(block) > 1)
               for part in _partitions(list(range(len(tables)))))


@st.composite
def _batches(draw):
    """Up to 7 tables drawn as paths of a small random tree of block ids (how the radix
    tree and forks hand blocks out), each with a number of full blocks."""
    n = draw(st.integers(1, 7))
    tables: list[list[int]] = []
    next_id = 1
    for _ in range(n):
        if tables and draw(st.booleans()):
            base = draw(st.sampled_from(tables))
            table = base[:draw(st.integers(0, len(base)))]
        else:
            table = []
        for _ in range(draw(st.integers(1 if not table else 0, 4))):
            table.append(next_id)
            next_id += 1
        tables.append(table)
    full = [draw(st.integers(0, len(t))) for t in tables]
    return tables, full


@settings(max_examples=300, deadline=None)
@given(_batches())
def test_partition_is_optimal_and_valid(batch):
    tables, full = batch
    groups = common_prefix_groups(tables, full)
    seen = set()
    for g in groups:
        assert len(g.indices) >= 2 and g.num_blocks >= 1
        assert list(g.indices) == sorted(g.indices) and not seen & set(g.indices)
        seen |= set(g.indices)
        # Every member holds the group's blocks as full blocks, the same ids.
        assert all(full[i] >= g.num_blocks for i in g.indices)
        assert len({tuple(tables[i][:g.num_blocks]) for i in g.indices}) == 1
    assert groups == sorted(groups)
    assert _saved(groups) == _best_by_exhaustion(tables, full)


# ------------------------------------------------------------------ the scheduler's groups

BS = 4


def _scheduler(cascade: bool = True, caching: bool = True) -> Scheduler:
    config = EngineConfig(num_blocks=64, max_num_seqs=8, max_num_batched_tokens=256,
                          disable_cascade_attn=not cascade)
    return Scheduler(config, KVCacheManager(BlockPool(64, BS), enable_prefix_caching=caching),
                     max_model_len=1000)


def _run(sched: Scheduler, steps: int) -> list:
    outs = []
    for _ in range(steps):
        out = sched.schedule()
        sched.update_from_output(out, [[7]] * sum(out.sampling))
        outs.append(out)
    return outs


def test_scheduler_groups_requests_sharing_a_cached_prompt_prefix():
    doc = list(range(100, 110))                     # 10 tokens: 2 full blocks + 2
    reqs = [Request(i, doc + [200 + i, 300 + i], SamplingParams(max_tokens=4, ignore_eos=True))
            for i in range(3)]
    other = Request(9, list(range(500, 512)), SamplingParams(max_tokens=4, ignore_eos=True))
    sched = _scheduler()
    for r in (*reqs, other):
        sched.add_request(r)
    prefill, decode = _run(sched, 2)
    # The first request computes the document; the others wait for it (in-batch prefix
    # deduplication), so step 1 is request 0's and the other's prefill: no decode, and no
    # block written before the step (a chunk never shares what its own step computes).
    assert prefill.cascade_groups == []
    # Step 2: request 0 and the other decode, requests 1 and 2 prefill their own tokens
    # after hitting the cached document (3 full blocks of request 0 are cached, 2 shared).
    assert [r.request_id for r in decode.requests] == [0, 9, 1, 2]
    assert decode.num_scheduled_tokens == [1, 1, 4, 4]
    # One decode per prefix; the two prefill chunks share the document's cached blocks.
    assert decode.cascade_groups == [CascadeGroup((2, 3), 2)]
    third = _run(sched, 1)[0]
    assert [r.request_id for r in third.requests] == [0, 9, 1, 2]
    assert third.num_scheduled_tokens == [1, 1, 1, 1]
    shared = reqs[0].block_tables[0][:2]
    assert all(r.block_tables[0][:2] == shared for r in reqs)
    assert third.cascade_groups == [CascadeGroup((0, 2, 3), 2)]


def test_scheduler_groups_forked_samples_and_respects_the_switch():
    for cascade in (True, False):
        sched = _scheduler(cascade, caching=False)
        parent = Request(0, list(range(100, 109)), SamplingParams(max_tokens=6, ignore_eos=True))
        sched.add_request(parent)
        _run(sched, 1)
        children = [Request(0, parent.prompt_token_ids, parent.sampling_params,
                            sample_index=k) for k in (1, 2)]
        sched.add_samples(parent, children)
        out = _run(sched, 1)[0]
        # Samples 1 and 2 recompute the last prompt token (one token, as a decode): all
        # three share the prompt's two full blocks (the third, partial one is copied).
        assert out.num_scheduled_tokens == [1, 1, 1]
        assert out.cascade_groups == ([CascadeGroup((0, 1, 2), 2)] if cascade else [])
