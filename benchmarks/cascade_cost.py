"""The per-layer decode attention time of one group of rows sharing a prefix, plain paged
attention against cascade attention (the prefix once for the group, each row's own blocks
apart, merged by their log-sum-exp), over group sizes and shared-prefix lengths: the
measurements behind ``mlxpa.worker.cascade.worth_cascading``.

    python benchmarks/cascade_cost.py [--kernel cpu] [--rows 2,4,8,...] [--blocks 1,2,...]
        [--own 2] [--heads 4x1] [--head-dim 256] [--repeats 5] [--json PATH]

Each cell is the minimum over ``--repeats`` of ``mx.eval`` around one layer's attention of
``rows`` decode rows that share ``blocks`` blocks and own ``--own`` blocks each (float32
pools, Gemma 3 270M's geometry by default: 4 query heads over 1 KV head of 256). It prints,
per cell, the plain time, the cascade time and their ratio (above 1: cascade is faster).
"""

from __future__ import annotations

import argparse
import json
import time

import mlx.core as mx
import numpy as np

from mlxpa.kernels import PagedKV, cascade_attention, paged_attention
from mlxpa.worker.cascade import cascade_tables

BS = 16


def case(rows: int, blocks: int, own: int, q_heads: int, kv_heads: int, d: int, seed: int = 0):
    """Pools, tables and queries of ``rows`` rows sharing ``blocks`` blocks, ``own`` each."""
    rng = np.random.default_rng(seed)
    nblocks = 1 + blocks + rows * own
    ids = rng.permutation(np.arange(1, nblocks)).astype(np.int32)
    shared, mine = ids[:blocks], ids[blocks:].reshape(rows, own)
    tables = np.concatenate([np.repeat(shared[None], rows, 0), mine], axis=1)
    ctx = np.full(rows, (blocks + own) * BS - BS // 2, np.int32)
    starts = ctx - 1
    kc = mx.random.normal((nblocks, kv_heads, BS, d))
    vc = mx.random.normal((nblocks, kv_heads, BS, d))
    q = mx.random.normal((rows, q_heads, 1, d))
    c = cascade_tables([(list(range(rows)), blocks)], starts, tables,
                       np.full(rows, blocks + own), BS, None, lambda r, b: True)
    mx.eval(kc, vc, q)
    return q, kc, vc, mx.array(tables), mx.array(ctx), mx.array(starts), c


def seconds(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats + 1):   # the first run warms up
        t0 = time.perf_counter()
        mx.eval(fn())
        best = min(best, time.perf_counter() - t0)
    return best


def time_cell(inputs, scale: float, kernel: str, repeats: int) -> tuple[float, float]:
    """Seconds of one layer's plain and cascade attention of ``inputs`` (:func:`case`)."""
    q, kc, vc, bt, cl, qs, c = inputs
    kv = PagedKV(kc, vc, bt, cl, qs, scale)
    own = kv._replace(block_tables=c.block_tables, key_start=c.key_start)
    plain = seconds(lambda: paged_attention(q, kv, kernel=kernel), repeats)
    two = seconds(lambda: cascade_attention(q, own, c.prefix, kernel=kernel), repeats)
    return plain, two


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", default="cpu")
    ap.add_argument("--rows", default="2,4,8,16,32,64,128")
    ap.add_argument("--blocks", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--own", type=int, default=2)
    ap.add_argument("--heads", default="4x1", help="query heads x KV heads")
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    hq, hkv = map(int, a.heads.split("x"))
    scale = a.head_dim ** -0.5
    rows_list = [int(x) for x in a.rows.split(",")]
    blocks_list = [int(x) for x in a.blocks.split(",")]
    results = []
    print("| rows | shared blocks | plain ms | cascade ms | plain / cascade |")
    print("|---|---|---|---|---|")
    for rows in rows_list:
        for blocks in blocks_list:
            plain, two = time_cell(case(rows, blocks, a.own, hq, hkv, a.head_dim), scale,
                                   a.kernel, a.repeats)
            results.append({"rows": rows, "blocks": blocks, "plain_s": plain, "cascade_s": two})
            print(f"| {rows} | {blocks} | {plain * 1e3:.2f} | {two * 1e3:.2f} | "
                  f"{plain / two:.2f} |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"own_blocks": a.own, "heads": a.heads, "head_dim": a.head_dim,
                       "kernel": a.kernel, "cells": results}, f, indent=1)


if __name__ == "__main__":
    main()
