"""vLLM's shapes of the parameters, without a model: ``SamplingParams(logprobs=k,
structured_outputs=StructuredOutputsParams(...))`` kept as the one canonical constraint the
rows give too, the rows' OpenAI ``logprobs`` / ``top_logprobs`` onto ``logprobs``, the
``LLM`` keywords onto ``EngineConfig`` (one table), and ``import mlxpa`` staying light."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from mlxpa import SamplingParams, StructuredOutputsParams
from mlxpa.config import EngineConfig
from mlxpa.data.reader_options import RowSpec
from mlxpa.data.rows import parse_row
from mlxpa.entrypoints.engine_args import engine_config
from mlxpa.sampling_params import JSON_OBJECT, StructuredOutput

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}


def _row(fields: dict):
    return parse_row({"prompt": "p", **fields}, 0, 1, RowSpec("in.jsonl"))


@pytest.mark.parametrize(("params", "row_field", "canonical"), [
    (StructuredOutputsParams(choice=["yes", "no"]), {"guided_choice": ["yes", "no"]},
     StructuredOutput("choice", '["yes", "no"]')),
    (StructuredOutputsParams(json=SCHEMA), {"response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
     StructuredOutput("json", json.dumps(SCHEMA, separators=(",", ":")))),
    (StructuredOutputsParams(json=json.dumps(SCHEMA)), {"structured_outputs": {"json": SCHEMA}},
     StructuredOutput("json", json.dumps(SCHEMA, separators=(",", ":")))),
    (StructuredOutputsParams(regex="[0-9]+"), {"guided_regex": "[0-9]+"},
     StructuredOutput("regex", "[0-9]+")),
    (StructuredOutputsParams(grammar='start: "a"'), {"structured_outputs": {
        "grammar": 'start: "a"'}}, StructuredOutput("grammar", 'start: "a"')),
    (StructuredOutputsParams(json_object=True), {"response_format": {"type": "json_object"}},
     StructuredOutput("json", JSON_OBJECT)),
])
def test_structured_outputs_params_are_the_rows_canonical_constraint(params, row_field,
                                                                    canonical):
    sp = SamplingParams(structured_outputs=params)
    assert sp.structured_outputs == canonical  # kept canonical: one representation
    row = _row(row_field)
    assert row.error is None and row.params["structured_outputs"] == canonical
    assert dataclasses.replace(SamplingParams(), **row.params) == sp  # a row's field = the API's


@pytest.mark.parametrize(("fields", "want"), [
    ({"logprobs": True}, 0), ({"logprobs": True, "top_logprobs": 3}, 3), ({"logprobs": 2}, 2),
    ({"top_logprobs": 4}, 4), ({"logprobs": False, "top_logprobs": 5}, None),
    ({"logprobs": False}, None), ({"top_logprobs": 0}, "absent"), ({}, "absent"),
])
def test_the_rows_openai_logprobs_fields_map_onto_vllms_logprobs(fields, want):
    row = _row(fields)
    assert row.error is None
    assert row.params.get("logprobs", "absent") == want
    if want != "absent":  # a row's false also turns an API default off
        assert dataclasses.replace(SamplingParams(logprobs=7), **row.params).logprobs == want


def test_the_defaults_are_mlxpas_not_vllms():
    sp = SamplingParams()
    assert (sp.temperature, sp.max_tokens, sp.logprobs, sp.structured_outputs, sp.n) == (
        0.0, 256, None, None, 1)


def test_llm_keywords_are_the_engine_config_fields():
    options = {"kv_cache_memory_bytes": 3 * 2**30, "dtype": "auto", "max_num_seqs": 8,
               "enable_prefix_caching": False, "adapter_path": "a", "keep_quantized": True,
               "attention_backend": "cpu", "revision": "v1", "seed": 4, "block_size": 32,
               "max_num_batched_tokens": 512, "max_model_len": 1024}
    config = engine_config("m", options)
    assert config == EngineConfig(model="m", **options)
    assert (config.kv_cache_memory_bytes, config.dtype, config.attention_backend) == (
        3 * 2**30, "auto", "cpu")
    assert engine_config(None, {}) == EngineConfig()
    assert engine_config(None, {"dtype": None, "kv_cache_dtype": None}) == EngineConfig()
    with pytest.raises(ValueError, match="kv_cache_memory_bytes must be a number of bytes"):
        engine_config(None, {"kv_cache_memory_bytes": 0})


def test_cascade_attention_keyword_is_vllms():
    assert engine_config(None, {"disable_cascade_attn": True}).disable_cascade_attn is True
    assert engine_config(None, {}).disable_cascade_attn is False
    with pytest.raises(ValueError, match="disable_cascade_attn must be true or false, got 1"):
        engine_config(None, {"disable_cascade_attn": 1})
    with pytest.raises(TypeError, match="unexpected keyword argument 'enable_cascade_attention'"):
        engine_config(None, {"enable_cascade_attention": False})


def test_import_mlxpa_exports_the_api_without_loading_mlx():
    code = ("import sys, mlxpa\n"
            "from mlxpa import (SamplingParams, StructuredOutputsParams, RequestOutput,\n"
            "                   CompletionOutput, Logprob)\n"
            "print(any(m.split('.')[0] in ('mlx', 'mlx_lm') for m in sys.modules))\n"
            "from mlxpa import LLM\n"
            "print(LLM.__module__, 'mlx.core' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300).stdout.split()
    assert out == ["False", "mlxpa.entrypoints.llm", "True"]


def test_llm_kv_cache_dtype_matches_mlx_lm_quantized_cache(tmp_path):
    """``LLM(kv_cache_dtype="int8")`` (issue 22's option under vLLM's name) stores the KV pool
    as mlx-lm's 8-bit group quantization: greedy ids equal mlx-lm's own generation through
    its ``QuantizedKVCache`` on the same folder."""
    from mlx_lm import load

    from mlxpa import LLM, SamplingParams
    from tests.engine.test_kv_quant import mlx_lm_quantized
    from tests.tiny_models import save_tiny_model

    folder = save_tiny_model(tmp_path / "m", hidden=256)  # head_dim 64: one group per head
    llm = LLM(folder, kv_cache_dtype="int8", kv_cache_memory_bytes=2**22)
    assert "int8" in llm.llm_engine.runner.kv_storage.describe()
    prompts = ["one two three", "the cat sat on"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    model, tok = load(folder)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == mlx_lm_quantized(model, tok.encode(prompt), "int8",
                                                            n=8)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(folder, kv_cache_dtype="fp8")
