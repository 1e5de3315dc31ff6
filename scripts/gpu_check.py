"""Check and time mlxpa's CUDA paged-attention twin on an NVIDIA GPU, without MLX.

The kernel text is ``cuda_paged_attention.generated_source`` (MLX's CUDA code generation of the
shared Metal bodies); ``nvcc`` compiles it and CuPy launches it with MLX's grid rule. Without
MLX, a stand-in ``mlx.core`` (dtype names only) lets the kernel modules load.

1. Correctness: random ragged cases (lengths 0, 1, block size +- 1, 700, 1500; windows with
   trimmed tables) in float32/float16/bfloat16, both variants, against a float64 reference;
   and over quantized pools (``qv1``/``qv2``, ``--kv-cache-dtype``: int8, int4, k8v4 with
   packed words, scales and biases made by an affine quantizer here; the reference attends
   over their dequantized values); and cascade attention's own-keys twins (``v1_lse``,
   ``qv1_lse``, ``reduce_lse``: keys from a block offset, float32 output and log-sum-exp)
   against the float64 output and log-sum-exp of the same keys.
2. Timing: decode at contexts 512..32k and batch 1..256 (bfloat16), v1, v2 and the variant
   ``choose_variant_cuda`` picks, against gather + SDPA (PyTorch), with bandwidth (K/V bytes read)
   as a fraction of a measured device-to-device copy (bytes read + written).

Usage: ``python scripts/gpu_check.py [--quick] [--json PATH]``; ``--build-only`` compiles the
kernels and exits (runs without a GPU). First run on an H200 on 2026-12-04 (docs/kernels.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (dtype name, head_dim, block_size, q_heads, kv_heads, window)
CHECK_INSTANCES = [(dt, *s) for dt in ("float32", "float16", "bfloat16") for s in
                   ((64, 8, 4, 4, None), (128, 16, 8, 2, 20), (256, 32, 8, 1, None),
                    (256, 16, 4, 1, 512))]
# Quantized pools (kbits, vbits, group_size) checked on these instances.
QUANT_CHECKS = [(("bfloat16", 128, 16, 8, 2, 20), (8, 4, 64)),
                (("float16", 256, 16, 4, 1, 512), (4, 4, 64)),
                (("float32", 64, 8, 4, 4, None), (8, 8, 32))]
BENCH_INSTANCES = {"llama-8b": ("bfloat16", 128, 16, 32, 8, None),
                   "gemma3-270m": ("bfloat16", 256, 16, 4, 1, None)}
TOL = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 4e-3}
NP_STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


def load_kernel_modules(force_stub: bool = False):
    """Import ``_common`` and ``cuda_paged_attention`` without running package __init__ files,
    with a stand-in ``mlx.core`` where MLX is absent. Returns (mx, _common, cuda module)."""
    try:
        if force_stub:
            raise ImportError
        import mlx.core as mx
    except ImportError:
        mx = types.ModuleType("mlx.core")
        mx.Dtype = type("Dtype", (), {"__repr__": lambda self: f"mlx.core.{self.name}"})
        for name in ("float32", "float16", "bfloat16", "int32", "uint16", "uint32"):
            setattr(mx, name, mx.Dtype())
            getattr(mx, name).name = name
        mx.metal = mx.cuda = types.SimpleNamespace(is_available=lambda: False)
        sys.modules["mlx"] = types.ModuleType("mlx")
        sys.modules["mlx"].core = mx
        sys.modules["mlx.core"] = mx
    for pkg in ("mlxpa", "mlxpa.kernels"):
        if pkg not in sys.modules:
            module = types.ModuleType(pkg)
            module.__path__ = [os.path.join(ROOT, *pkg.split("."))]
            sys.modules[pkg] = module
    from mlxpa.kernels import _common, cuda_paged_attention

    return mx, _common, cuda_paged_attention


mx, C, CU = load_kernel_modules(bool(os.environ.get("MLXPA_GPU_CHECK_STUB_MLX")))


def compile_instance(inst, workdir: str, arch: str,
                     quant=None) -> tuple[str, dict[str, str]]:
    """nvcc the v1/v2/reduce kernels of one instance (``quant``: the quantized-pool qv1/qv2)
    into a cubin; returns its path and the mangled name per kind (from ``ptxas -v``)."""
    dt, d, bs, hq, hkv, window = inst
    shape = C.DecodeShape(1, hq, hkv, d, bs, 64, window or 0, getattr(mx, dt),
                          *(quant or (0, 0, 0)))
    launches = all_launches(shape)
    tag = "_".join(str(x) for x in (*inst, *(quant or ())))
    cu, cubin = os.path.join(workdir, tag + ".cu"), os.path.join(workdir, tag + ".cubin")
    with open(cu, "w") as f:
        f.write("\n".join(CU.generated_source(ln) for ln in launches))
    r = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-Xptxas", "-v", "-o", cubin, cu],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"nvcc failed for {tag}:\n{r.stderr[-4000:]}")
    names = {}
    for m in re.finditer(r"Compiling entry function '(\w+)'", r.stderr):
        names[kernel_kind(m.group(1))] = m.group(1)
    return cubin, names


def all_launches(shape) -> list:
    """One launch of every kernel kind a shape uses: v1, v2 + reduce and the ``_lse`` twins
    (v2 once)."""
    launches = {}
    for lse in (False, True):
        for variant in ("v1", "v2"):
            for ln in C.plan(shape, variant, lse=lse):
                launches.setdefault(ln.kind, ln)
    return list(launches.values())


def kernel_kind(name: str) -> str:
    """The kind (``v1``, ``qv1_lse``, ...) of a kernel from its (possibly mangled) name."""
    return re.search(r"mlxpa_paged_((?:q?v[12]|reduce)(?:_lse)?)_[0-9a-f]{10}", name).group(1)


def rounded(x: np.ndarray, dt: str) -> tuple[np.ndarray, np.ndarray]:
    """``x`` in storage ``dt`` (bfloat16 as uint16 bits, round to nearest even) and as
    float32."""
    x = x.astype(np.float32)
    if dt == "bfloat16":
        u = x.view(np.uint32).astype(np.uint64)
        bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        return bits, (bits.astype(np.uint32) << 16).view(np.float32)
    stored = x.astype(NP_STORAGE[dt])
    return stored, stored.astype(np.float32)


def quantize(x: np.ndarray, bits: int, group_size: int, dt: str):
    """Affine group quantization of ``x`` (``[..., D]``) along its last axis in MLX's packed
    layout (element ``e`` at bit ``e * bits % 32`` of word ``e * bits // 32``): ``((packed
    uint32, scales, biases in storage dt), dequantized float32 values)``."""
    *lead, d = x.shape
    g = x.reshape(*lead, d // group_size, group_size).astype(np.float32)
    lo, hi = g.min(-1), g.max(-1)
    levels = 2**bits - 1
    scales, s = rounded(np.where(hi > lo, (hi - lo) / levels, 1.0), dt)
    biases, b = rounded(lo, dt)
    q = np.clip(np.rint((g - b[..., None]) / s[..., None]), 0, levels).astype(np.uint32)
    per = 32 // bits
    words = q.reshape(*lead, d // per, per) << (np.arange(per, dtype=np.uint32) * bits)
    packed = np.bitwise_or.reduce(words, axis=-1).astype(np.uint32)
    values = (q * s[..., None] + b[..., None]).reshape(x.shape)
    return (packed, scales, biases), values.astype(np.float32)


def make_case(rng, inst, lens, trim, quant=None, skip_blocks=None):
    """Host arrays of a random case, values already rounded to the storage dtype (``quant``:
    ``(kbits, vbits, group_size)``: the pools quantized, ``kc``/``vc`` holding the three
    arrays and their dequantized values; ``skip_blocks``: per row, leading blocks left out of
    its table, its keys starting there, as cascade attention's own-keys part)."""
    dt, d, bs, hq, hkv, window = inst
    starts = [max(0, n - window) // bs * bs if trim and window else 0 for n in lens]
    if skip_blocks is not None:
        starts = [max(s, k * bs) for s, k in zip(starts, skip_blocks)]
    counts = [-(-(n - s) // bs) if n > s else 0 for n, s in zip(lens, starts)]
    num_blocks = 1 + sum(counts) + 2
    perm = list(rng.permutation(np.arange(1, num_blocks)))
    table = np.zeros((len(lens), max(counts + [1]) + 1), np.int32)
    for r, c in enumerate(counts):
        table[r, :c] = [perm.pop() for _ in range(c)]

    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    pool = (num_blocks, hkv, bs, d)
    if quant is None:
        kc, vc = rounded(normal(*pool), dt), rounded(normal(*pool), dt)
    else:
        kc, vc = (quantize(normal(*pool), bits, quant[2], dt) for bits in quant[:2])
    lens_np = np.array(lens, np.int32)
    return {"q": rounded(normal(len(lens), hq, d), dt), "kc": kc, "vc": vc, "table": table,
            "lens": lens_np,
            "qstart": np.maximum(lens_np - 1, 0), "kstart": np.array(starts, np.int32),
            "scale": d ** -0.5, "window": window}


def reference_f64(case, inst, lse: bool = False):
    """Dense float64 attention from the masking rule; rows without keys are zeros (``lse``:
    also ``[B, hq]`` log-sum-exps, -inf on rows without keys)."""
    q, kc, vc = (case[k][1].astype(np.float64) for k in ("q", "kc", "vc"))
    b, hq, d = q.shape
    hkv, group = kc.shape[1], hq // kc.shape[1]
    out = np.zeros_like(q)
    sums = np.full((b, hq), -np.inf)
    for r in range(b):
        k = kc[case["table"][r]].transpose(1, 0, 2, 3).reshape(hkv, -1, d)
        v = vc[case["table"][r]].transpose(1, 0, 2, 3).reshape(hkv, -1, d)
        kpos = case["kstart"][r] + np.arange(k.shape[1])
        p = case["qstart"][r]
        vis = (kpos <= p) & (kpos < case["lens"][r])
        if case["window"]:
            vis &= kpos > p - case["window"]
        if not vis.any():
            continue
        for g in range(hkv):
            s = q[r, g * group:(g + 1) * group] @ k[g][vis].T * case["scale"]
            w = np.exp(s - s.max(axis=1, keepdims=True))
            out[r, g * group:(g + 1) * group] = (w / w.sum(axis=1, keepdims=True)) @ v[g][vis]
            sums[r, g * group:(g + 1) * group] = s.max(axis=1) + np.log(w.sum(axis=1))
    return (out, sums) if lse else out


def prepare(xp, inst, dev, variant, quant=None, lse=False):
    """Launches and inputs of one decode call, as ``_common.run_decode`` builds them. ``dev``
    holds device arrays q [B, hq, D], kc, vc (quantized: a tuple of packed words, scales,
    biases each), table, lens, qstart, kstart and ``scale``."""
    dt, d, bs, hq, hkv, window = inst
    b, mb = dev["table"].shape
    shape = C.DecodeShape(b, hq, hkv, d, bs, mb, window or 0, getattr(mx, dt),
                          *(quant or (0, 0, 0)))
    meta = xp.asarray(np.array([mb, shape.num_partitions], np.int32))
    pools = [a for k in ("kc", "vc")
             for a in (dev[k] if isinstance(dev[k], tuple) else (dev[k],))]
    inputs = [dev["q"], *pools, dev["table"], dev["lens"], dev["qstart"], dev["kstart"], meta,
              xp.asarray(np.array([dev["scale"]], np.float32))]
    return C.plan(shape, variant or C.choose_variant_cuda(shape), lse=lse), inputs


def launch(xp, fns, launches, inputs):
    """Run the launches (MLX's grid rule: blocks = threads / threadgroup); return the last
    launch's outputs (the output; with an ``_lse`` twin, and the log-sum-exps).
    ``fns[kind](grid, block, args)`` launches one kernel (a CuPy RawKernel's signature)."""
    outs = []
    for ln in launches:
        args = inputs if not ln.kind.startswith("reduce") else outs + [inputs[-2]]
        outs = [xp.empty(s, NP_STORAGE[str(t).split(".")[-1]])
                for s, t in zip(ln.output_shapes, ln.output_dtypes)]
        grid = tuple(g // t for g, t in zip(ln.grid, ln.threadgroup))
        fns[ln.kind](grid, ln.threadgroup, tuple(args + outs))
    return outs


def to_float(x: np.ndarray, dt: str) -> np.ndarray:
    if dt == "bfloat16":
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def check_case(xp, fns, inst, seed: int, variant: str, to_host=np.asarray,
               quant=None, lse: bool = False) -> str | None:
    """Run one random case (``quant``: over quantized pools; ``lse``: the ``_lse`` twins on
    rows whose keys start 0-3 blocks in); return why it fails, or None."""
    bs, window = inst[2], inst[5]
    case = make_case(np.random.default_rng(seed), inst, [0, 1, bs - 1, bs + 1, 700, 1500],
                     trim=window is not None, quant=quant,
                     skip_blocks=[0, 0, 0, 1, 3, 2] if lse else None)

    def device(v):
        if isinstance(v, tuple):
            v = v[0]
        return tuple(map(xp.asarray, v)) if isinstance(v, tuple) else xp.asarray(v)

    dev = {k: device(case[k]) for k in ("q", "kc", "vc", "table", "lens", "qstart", "kstart")}
    dev["scale"] = case["scale"]
    outs = launch(xp, fns, *prepare(xp, inst, dev, variant, quant, lse))
    out = to_float(to_host(outs[0]), "float32" if lse else inst[0])
    ref = reference_f64(case, inst, lse)
    tol = TOL[inst[0]]
    if lse:
        ref, ref_lse = ref
        got_lse, empty = to_host(outs[1]), case["lens"] == 0
        if not np.all(got_lse[empty] <= -1e30):
            return "rows without keys have a finite log-sum-exp"
        lse_err = np.abs(got_lse[~empty] - ref_lse[~empty])
        if not np.all(lse_err <= tol + tol * np.abs(ref_lse[~empty])):  # NaN fails too
            return f"log-sum-exp max error {np.nanmax(lse_err):.3g}"
    if not np.all(np.isfinite(out)) or not np.all(out[case["lens"] == 0] == 0):
        return "non-finite output or nonzero empty row"
    err = np.abs(out - ref)
    if np.any(err > tol + tol * np.abs(ref)):
        return f"max error {err.max():.3g}"
    return None


def bench(cp, torch, fns, inst, contexts, batches, copy_bw, quick) -> list[dict]:
    """Decode timings for one instance over contexts x batches (uniform lengths)."""
    dt, d, bs, hq, hkv, window = inst
    mb_max = -(-max(contexts) // bs)
    blocks = 1 + max(batches) * mb_max
    pool = (blocks, hkv, bs, d)
    kc = cp.full(pool, 0x3C00, cp.uint16)          # bf16 0.0078: values do not matter here
    vc = cp.full(pool, 0x3C00, cp.uint16)
    rows = []
    for ctx in contexts:
        for b in batches:
            mb = -(-ctx // bs)
            table = cp.random.permutation(blocks - 1)[:b * mb].reshape(b, mb).astype(cp.int32)
            dev = {"q": cp.full((b, hq, d), 0x3F80, cp.uint16), "kc": kc, "vc": vc,
                   "table": table + 1, "lens": cp.full(b, ctx, cp.int32),
                   "qstart": cp.full(b, ctx - 1, cp.int32), "kstart": cp.zeros(b, cp.int32),
                   "scale": d ** -0.5}
            shape = C.DecodeShape(b, hq, hkv, d, bs, mb, 0, getattr(mx, dt))
            kv_bytes = 2 * b * ctx * hkv * d * 2
            row = {"ctx": ctx, "batch": b, "auto": C.choose_variant_cuda(shape),
                   "kv_gb": kv_bytes / 1e9}
            for variant in ("v1", "v2"):
                plan = prepare(cp, inst, dev, variant)
                t = time_cuda(cp, lambda p=plan: launch(cp, fns, *p), quick)
                row[variant + "_ms"] = t * 1e3
                row[variant + "_bw_frac"] = kv_bytes / t / copy_bw
            row["gather_sdpa_ms"] = baseline_ms(cp, torch, dev, inst, kv_bytes, quick)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def time_cuda(cp, fn, quick: bool) -> float:
    """Median seconds of ``fn`` over CUDA events, after warm-up."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(3 if quick else 10):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    return float(np.median(times))


def baseline_ms(cp, torch, dev, inst, kv_bytes, quick) -> float | None:
    """gather + SDPA in PyTorch (GQA as G queries per KV head); None if skipped or OOM."""
    if torch is None or 2 * kv_bytes > 48e9:
        return None
    dt, d, bs, hq, hkv, window = inst
    tk = {k: torch.from_dlpack(dev[k]) for k in ("q", "kc", "vc", "table", "lens")}
    kc, vc = (tk[k].view(torch.bfloat16) for k in ("kc", "vc"))
    q = tk["q"].view(torch.bfloat16)
    b, mb = tk["table"].shape
    table, pos = tk["table"].long(), torch.arange(mb * bs, device=q.device)

    def run():
        k = kc[table].permute(0, 2, 1, 3, 4).reshape(b, hkv, mb * bs, d)
        v = vc[table].permute(0, 2, 1, 3, 4).reshape(b, hkv, mb * bs, d)
        mask = (pos[None, :] < tk["lens"][:, None])[:, None, None, :]
        return torch.nn.functional.scaled_dot_product_attention(
            q.view(b, hkv, hq // hkv, d), k, v, attn_mask=mask, scale=dev["scale"])

    try:
        return time_cuda(cp, run, quick) * 1e3
    except torch.cuda.OutOfMemoryError:
        return None
    finally:
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer points and repetitions")
    ap.add_argument("--build-only", action="store_true", help="compile and exit (no GPU)")
    ap.add_argument("--arch", default="sm_90a", help="nvcc -arch (default sm_90a)")
    ap.add_argument("--json", help="write all results here")
    a = ap.parse_args()
    checks = CHECK_INSTANCES[::5] if a.quick else CHECK_INSTANCES   # quick: one per dtype
    quant_checks = QUANT_CHECKS[:1] if a.quick else QUANT_CHECKS
    insts = [(i, None) for i in sorted(set(checks) | set(BENCH_INSTANCES.values()), key=str)]
    insts += quant_checks
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(os.cpu_count()) as pool:
        built = dict(zip(insts, pool.map(lambda iq: compile_instance(*iq[:1], tmp, a.arch,
                                                                     iq[1]), insts)))
        print(f"built {len(built)} instances for {a.arch}", flush=True)
        if a.build_only:
            return 0
        import cupy as cp
        try:
            import torch
        except ImportError:
            torch = None
        fns = {i: {k: cp.RawModule(path=cubin).get_function(n) for k, n in names.items()}
               for i, (cubin, names) in built.items()}
    print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), flush=True)
    failures = []
    for n, (inst, quant) in enumerate([(i, None) for i in checks] + quant_checks):
        for variant, lse in (("v1", False), ("v2", False), ("v1", True), ("v2", True)):
            name = variant + ("_lse" if lse else "")
            try:
                why = check_case(cp, fns[(inst, quant)], inst, n, variant, cp.asnumpy, quant,
                                 lse)
            except Exception as e:  # noqa: BLE001 - report and go on
                why = f"{type(e).__name__}: {e}"
            print(f"check {inst}{f' {quant}' if quant else ''} {name}: {why or 'ok'}",
                  flush=True)
            failures += [(inst, name, why)] if why else []
    src = cp.ones(1 << 30, cp.float32)   # 4 GiB device-to-device copy: read + written bytes
    dst = cp.empty_like(src)
    copy_bw = 2 * src.nbytes / time_cuda(cp, lambda d=dst, s=src: cp.copyto(d, s), a.quick)
    del src, dst
    print(f"device-to-device copy: {copy_bw / 1e12:.2f} TB/s (read + write)", flush=True)
    contexts = [512, 8192] if a.quick else [512, 2048, 8192, 32768]
    batches = [1, 64] if a.quick else [1, 16, 64, 256]
    results = {"copy_tb_s": copy_bw / 1e12}
    for name, inst in BENCH_INSTANCES.items():
        print(f"bench {name} {inst}", flush=True)
        try:
            results[name] = bench(cp, torch, fns[(inst, None)], inst, contexts, batches,
                                  copy_bw, a.quick)
        except Exception as e:  # noqa: BLE001 - keep the other instance's numbers
            print(f"bench {name} failed: {type(e).__name__}: {e}", flush=True)
            failures.append((name, "bench", str(e)))
        cp.get_default_memory_pool().free_all_blocks()
    results["failures"] = [list(map(str, f)) for f in failures]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    print("FAILED" if failures else "all checks passed", f"({len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
