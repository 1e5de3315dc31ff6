"""KV cache groups (mlxpa.core.kv_cache_groups): which layers share a block table, with the
shapes of real models, and what one request holds in each group, checked by hand."""

from __future__ import annotations

from mlxpa.core.kv_cache_groups import KVCacheGroupSpec, group_entries


def _pattern(num_layers: int, full_every: int, window: int) -> list:
    """Gemma 3's layer kinds: every ``full_every``-th layer full attention, the others a
    ``window``-token sliding window, every pool alike."""
    return [(None if (i + 1) % full_every == 0 else window, "pool") for i in range(num_layers)]


def test_one_kind_is_one_group_of_every_layer():
    layout = group_entries([(None, "a"), (None, "b"), None, (None, "a")], 16, recurrent=(2,),
                           snapshot_blocks=3)
    assert layout.groups == (KVCacheGroupSpec(None, (0, 1, 3)),)
    assert layout.num_slots == 3 and layout.recurrent == (2,) and layout.snapshot_blocks == 3
    assert layout.max_chunk_tokens is None and layout.note is None
    assert layout.group_kinds() == ["full_attention", "recurrent"]
    all_window = group_entries([(64, "a"), (64, "a")], 16)
    assert all_window.groups == (KVCacheGroupSpec(64, (0, 1)),)
    assert group_entries([None, None], 16, recurrent=(0, 1)).groups == ()


def test_gemma3_270m_is_six_groups_of_three():
    layout = group_entries(_pattern(18, 6, 512), 16)
    assert layout.num_slots == 3
    assert layout.groups[0] == KVCacheGroupSpec(None, (5, 11, 17))
    assert [g.sliding_window for g in layout.groups] == [None] + [512] * 5
    assert [g.entries for g in layout.groups[1:]] == [
        (0, 1, 2), (3, 4, 6), (7, 8, 9), (10, 12, 13), (14, 15, 16)]
    assert layout.max_chunk_tokens == 256  # half the window
    # the window before a 256-token chunk (511 keys) and the chunk: 767 tokens over at most
    # 49 blocks of 16 (48 when the chunk starts on a block); a decode step's: 512 keys over
    # at most 33
    assert layout.window_blocks(512, 256) == 49 and layout.window_blocks(512, 1) == 33
    assert layout.blocks_needed(8192, 2048) == 512 + 5 * 49
    assert layout.blocks_needed(8192, 1) == 512 + 5 * 33
    # past the cap only as far as spare blocks pay: one block of tokens per 5 spare blocks
    # (one in each window group), so a 2,048-token chunk's 112 more window blocks need 560
    assert layout.chunk_for_spare(0) == layout.chunk_for_spare(-3) == 256
    assert layout.chunk_for_spare(4) == 256 and layout.chunk_for_spare(5) == 272
    assert layout.chunk_for_spare(560) == 2048
    assert 5 * (layout.window_blocks(512, 2048) - layout.window_blocks(512, 256)) == 560
    assert group_entries(_pattern(18, 6, None), 16).chunk_for_spare(100) is None


def test_group_size_follows_vllm():
    # gpt-oss: 12 sliding (128) and 12 full, alternating: the most layers when under 1.5x
    # the fewest, so 2 groups of 12
    oss = group_entries([(128 if i % 2 == 0 else None, "p") for i in range(24)], 16)
    assert [len(g.entries) for g in oss.groups] == [12, 12] and oss.num_slots == 12
    assert oss.max_chunk_tokens == 256  # the window, but at least 256 tokens
    # Gemma 3 1B: 22 sliding and 4 full layers: groups of 4, the last one with 2 layers (2
    # of its 4 slots unused)
    one_b = group_entries(_pattern(26, 6, 512), 16)
    assert [len(g.entries) for g in one_b.groups] == [4, 4, 4, 4, 4, 4, 2]
    assert one_b.num_slots == 4


def test_pools_of_other_shapes_page_every_layer():
    """Gemma 4's global layers have other K/V widths than its window layers: no block can
    hold either, so every layer is paged for every token (vLLM's fallback) and a note says
    why."""
    kinds = [(1024, "small"), (1024, "small"), (None, "large")]
    layout = group_entries(kinds, 16)
    assert layout.groups == (KVCacheGroupSpec(None, (0, 1, 2)),)
    assert layout.num_slots == 3 and "full attention" in layout.note
