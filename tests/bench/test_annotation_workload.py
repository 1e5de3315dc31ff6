"""The annotation workload: one shared few-shot chat prefix, a review per row, the labels as a
choice constraint; the engine scores every label of a row and writes the best one."""

from __future__ import annotations

from mlxpa.bench.workloads import LABELS, make_workload
from mlxpa.config import EngineConfig
from mlxpa.loader.models import load_model
from tests.tiny_models import save_tiny_model

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_annotation_workload_shares_a_prefix_and_constrains_labels(tmp_path):
    folder = save_tiny_model(tmp_path / "m", chat_template=TEMPLATE)
    model, tok, _ = load_model(EngineConfig(model=folder))
    wl = make_workload("annotation", tok, num_prompts=6, seed=1)
    assert wl.structured.choices == LABELS and len(wl.prompts) == 6
    shared = min(len(p) for p in wl.prompts) // 2
    assert all(p[:shared] == wl.prompts[0][:shared] for p in wl.prompts)
    assert len({tuple(p) for p in wl.prompts}) > 1
    from mlxpa.bench.systems import run_mlxpa

    res = run_mlxpa(model, tok, wl, EngineConfig(block_size=8, num_blocks=256))
    assert res.num_requests == 6
    assert 6 * 7 <= res.generation_tokens <= 6 * 8  # one whole label each (byte tokens)
    # the labels are scored, not decoded: no grammar bitmask is ever filled
    assert res.extra["scored_tokens"] > 0 and res.extra["mask_ms_per_step"] is None
