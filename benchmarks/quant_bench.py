"""The default model in float32, 8-bit and 4-bit packed, and 4-bit dequantized at load: tok/s
and peak memory in one run, and each variant's greedy output checked against mlx-lm on the same
weights.

The 8- and 4-bit copies are made from the default model's MLX folder (converted once by
``mlxpa.loader.models.resolve_model``) with mlx-lm's own converter,
``python -m mlx_lm convert --hf-path <folder> --mlx-path <out> -q --q-bits N`` (affine, group
size 64), into ``--work-dir`` (kept between runs). The packed variants load with
``keep_quantized`` (``--keep-quantized``); "4-bit, dequantized at load" is what ``mlxpa run``
does on MLX's CPU back end by default (:mod:`mlxpa.loader.dequantize`: the 4-bit weights, their
values in float32). Each variant runs in its own process, so its peak memory (MLX's
``get_peak_memory`` and the process's max RSS) is its own: first mlx-lm's ``generate_step``
greedy ids for the first ``--check-prompts`` prompts on the loaded model (the oracle; for the
dequantized variant that is mlx-lm's own ``dequantize_model`` output), then the engine on the
whole random workload (timed), whose ids for those prompts must equal mlx-lm's.

    python benchmarks/quant_bench.py [--num-prompts 64 --input-len 256 --output-len 64]
        [--kv-memory 0.5] [--model FOLDER] [--work-dir DIR] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import mlxpa  # noqa: F401  (before mlx: the fast BLAS in this process)

# name: (bits of the mlx-lm copy, None for the float32 folder; keep the weights packed)
VARIANTS = {"float32": (None, False), "8-bit": (8, True), "4-bit": (4, True),
            "4-bit, dequantized at load": (4, False)}


def quantized_copy(src: Path, bits: int, work_dir: Path) -> Path:
    """``src`` converted by mlx-lm to ``bits``-bit affine weights (once) under ``work_dir``."""
    out = work_dir / f"{src.name}-q{bits}"
    if not (out / "config.json").is_file():
        work_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(src),
                        "--mlx-path", str(out), "-q", "--q-bits", str(bits)], check=True)
    return out


def run_variant(folder: str, keep_quantized: bool, num_prompts: int, input_len: int,
                output_len: int, check_prompts: int, kv_memory: float) -> dict:
    """One variant in this process: the oracle check, then the timed engine run."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    from mlxpa.bench.systems import run_mlxpa
    from mlxpa.bench.workloads import random_workload
    from mlxpa.config import EngineConfig
    from mlxpa.engine import LLMEngine
    from mlxpa.loader.models import load_model, model_dtype
    from mlxpa.request import EngineRequest
    from mlxpa.sampling_params import SamplingParams

    model, tok, _ = load_model(EngineConfig(model=folder, keep_quantized=keep_quantized,
                                            kv_cache_memory_bytes=int(kv_memory * 2**30)))
    wl = random_workload(tok, num_prompts, input_len, output_len)
    refs = {i: [int(t) for t, _ in generate_step(mx.array(wl.prompts[i]), model,
                                                  max_tokens=wl.output_lens[i])]
            for i in range(min(check_prompts, num_prompts))}
    mx.reset_peak_memory()
    config = EngineConfig(kv_cache_memory_bytes=int(kv_memory * 2**30))
    result = run_mlxpa(model, tok, wl, config)
    engine = LLMEngine(config, model, tok)
    got = {int(o.request_id): o.token_ids for o in engine.generate(
        EngineRequest(str(i), wl.prompts[i], SamplingParams(max_tokens=wl.output_lens[i],
                                                     ignore_eos=True)) for i in refs)}
    figures = result.figures()
    return {"folder": folder, "keep_quantized": keep_quantized,
            "packed_layers": sum(type(m).__name__.startswith("Quantized")
                                 for _, m in model.named_modules()),
            "compute_dtype": str(model_dtype(model)),
            "weights_bytes": sum(v.nbytes for _, v in _leaves(model)),
            "output_tokens_per_s": figures["output_tokens_per_s"],
            "total_tokens_per_s": figures["total_tokens_per_s"],
            "elapsed_s": figures["elapsed_s"],
            "peak_memory_bytes": figures["peak_memory_bytes"],
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "checked_prompts": len(refs),
            "identical_to_mlx_lm": all(got[i] == refs[i] for i in refs)}


def _leaves(model):
    from mlx.utils import tree_flatten

    return tree_flatten(model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="MLX folder (default: the default model)")
    ap.add_argument("--work-dir", default=None, help="where the quantized copies go "
                    "(default: <mlxpa cache>/models)")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--check-prompts", type=int, default=4)
    ap.add_argument("--kv-memory", type=float, default=0.5, help="KV pool GiB (the same for "
                    "every variant, so peak memory compares the weights)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--variant-folder", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--keep-quantized", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = (args.num_prompts, args.input_len, args.output_len, args.check_prompts,
             args.kv_memory)
    if args.variant_folder:
        print(json.dumps(run_variant(args.variant_folder, args.keep_quantized, *sizes)))
        return
    from mlxpa.loader.models import cache_dir, resolve_model

    src = resolve_model(args.model)
    work = Path(args.work_dir) if args.work_dir else cache_dir() / "models"
    results = {}
    for name, (bits, keep) in VARIANTS.items():
        folder = src if bits is None else quantized_copy(src, bits, work)
        out = subprocess.run(
            [sys.executable, __file__, "--variant-folder", str(folder),
             "--num-prompts", str(sizes[0]), "--input-len", str(sizes[1]),
             "--output-len", str(sizes[2]), "--check-prompts", str(sizes[3]),
             "--kv-memory", str(sizes[4]), *(["--keep-quantized"] if keep else [])],
            check=True, capture_output=True, text=True)
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{'variant':26} {'out tok/s':>10} {'total tok/s':>12} {'peak MLX MiB':>13} "
          f"{'max RSS MiB':>12} {'weights MiB':>12}  identical to mlx-lm")
    for name, r in results.items():
        print(f"{name:26} {r['output_tokens_per_s']:10.1f} {r['total_tokens_per_s']:12.1f} "
              f"{r['peak_memory_bytes'] / 2**20:13.0f} {r['max_rss_bytes'] / 2**20:12.0f} "
              f"{r['weights_bytes'] / 2**20:12.0f}  {r['identical_to_mlx_lm']} "
              f"({r['checked_prompts']} prompts)")
    if args.json:
        Path(args.json).write_text(json.dumps({"sizes": dict(zip(
            ("num_prompts", "input_len", "output_len", "check_prompts", "kv_memory_gib"),
            sizes)),
            "results": results}, indent=2))


if __name__ == "__main__":
    main()
