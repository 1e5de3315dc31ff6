"""How far mlx-lm's own quantized KV cache moves the label log-probabilities of
``examples/annotation.jsonl`` from its float cache, on the default model (or ``--model``):
the error of the scheme, with no mlxpa code in the computation.

Each row's chat prompt (the tokenizer's template, generation prompt added, as ``mlxpa run``
builds it) runs through the mlx-lm model once per cache set-up, and the log-softmax of the
last position is read at each label's token (the labels must be one token each):

- ``float``: mlx-lm's ``KVCache`` (the reference);
- ``QuantizedKVCache int8`` / ``int4``: mlx-lm's ``QuantizedKVCache`` in every layer from the
  first token (what mlxpa's ``--kv-cache-dtype int8|int4`` is token-identical to);
- ``generate_step int8``: what ``generate_step(..., kv_bits=8, quantized_kv_start=0)`` does
  without a prompt cache: all but the last prompt token attend in float, the cache is then
  quantized and the last token attends over it;
- ``keys int8 only`` / ``values int8 only``: a float cache holding each new key (value) row
  quantized and dequantized, the other half exact: which half the error comes from.

    python benchmarks/kv_quant_mlx_lm_error.py [--model FOLDER] [--group-size 64]
        [--labels positive,negative,neutral] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ANNOTATION = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "examples", "annotation.jsonl")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="MLX folder (default: the default model)")
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--labels", default="positive,negative,neutral")
    ap.add_argument("--annotation", default=ANNOTATION)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import mlx.core as mx
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    from mlxpa.config import EngineConfig
    from mlxpa.loader.models import load_model

    model, tok, _ = load_model(EngineConfig(model=a.model))
    gs = a.group_size
    labels = a.labels.split(",")
    label_ids = []
    for label in labels:
        ids = tok.encode(label, add_special_tokens=False)
        if len(ids) != 1:
            ap.error(f"label {label!r} is {len(ids)} tokens; this script reads one-token labels")
        label_ids.append(ids[0])

    class RoundTrip(KVCache):
        """A float cache whose new key (value) rows are quantized and dequantized."""

        def __init__(self, k_bits: int, v_bits: int) -> None:
            super().__init__()
            self.round_trip_bits = k_bits, v_bits  # not `bits`: mlx-lm reads that as quantized

        def update_and_fetch(self, keys, values):
            def rt(x, bits):
                if not bits:
                    return x
                return mx.dequantize(*mx.quantize(x, group_size=gs, bits=bits), group_size=gs,
                                     bits=bits)
            return super().update_and_fetch(rt(keys, self.round_trip_bits[0]),
                                           rt(values, self.round_trip_bits[1]))

    n = len(model.layers)

    def last_logprobs(ids: list[int], mode: str) -> list[float]:
        x = mx.array(ids)[None]
        if mode == "float":
            out = model(x, cache=[KVCache() for _ in range(n)])
        elif mode.startswith("QuantizedKVCache"):
            bits = int(mode[-1])
            out = model(x, cache=[QuantizedKVCache(group_size=gs, bits=bits) for _ in range(n)])
        elif mode == "generate_step int8":
            cache = [KVCache() for _ in range(n)]
            model(x[:, :-1], cache=cache)
            cache = [c.to_quantized(group_size=gs, bits=8) for c in cache]
            out = model(x[:, -1:], cache=cache)
        else:
            k_bits, v_bits = (8, 0) if mode.startswith("keys") else (0, 8)
            out = model(x, cache=[RoundTrip(k_bits, v_bits) for _ in range(n)])
        logits = out[0, -1].astype(mx.float32)
        lp = logits - mx.logsumexp(logits)
        return [lp[i].item() for i in label_ids]

    modes = ["float", "QuantizedKVCache int8", "QuantizedKVCache int4", "generate_step int8",
             "keys int8 only", "values int8 only"]
    rows = [json.loads(line) for line in open(a.annotation) if line.strip()]
    values: dict[str, dict[str, dict[str, float]]] = {m: {} for m in modes}
    for row in rows:
        ids = tok.apply_chat_template(row["messages"], add_generation_prompt=True)
        for m in modes:
            values[m][row["id"]] = dict(zip(labels, last_logprobs(ids, m)))
    largest = {m: max(abs(values[m][r][lab] - values["float"][r][lab])
                      for r in values["float"] for lab in labels) for m in modes[1:]}
    for m, d in largest.items():
        print(f"{m}: largest |label log-probability - float| = {d:.3f} nats")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "largest_difference": largest, "values": values}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
