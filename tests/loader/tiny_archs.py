"""Tiny random models of every architecture the installed mlx-lm ships.

One generic configuration spells the usual fields every way mlx-lm's model files do
(``hidden_size`` / ``n_embd`` / ``d_model``, ``num_attention_heads`` / ``n_head`` /
``num_heads``, ...); ``ModelArgs.from_dict`` keeps only the fields an architecture declares.
:data:`OVERRIDES` holds what a few architectures need on top (multimodal wrappers take a
``text_config``). Sliding windows are 8 tokens so short prompts cross them.
"""

from __future__ import annotations

import importlib
import pkgutil

import mlx.core as mx
import mlx_lm.models

from tests.tiny_models import _scale_weights

VOCAB = 256
# Modules of mlx_lm.models that are not architectures.
_HELPERS = {"activations", "base", "bitlinear_layers", "cache", "gated_delta", "mla",
            "pipeline", "rope_utils", "ssm", "switch_layers"}

BASE = dict(
    vocab_size=VOCAB, hidden_size=64, n_embd=64, d_model=64, dim=64, model_dim=64,
    num_hidden_layers=2, n_layer=2, n_layers=2, num_layers=2,
    intermediate_size=128, ffn_hidden_size=128, ffn_dim=128, hidden_dim=128,
    num_attention_heads=4, n_head=4, n_heads=4, num_heads=4,
    num_key_value_heads=2, num_kv_heads=2, n_kv_heads=2, head_dim=16,
    rms_norm_eps=1e-5, layer_norm_eps=1e-5, norm_eps=1e-5, layer_norm_epsilon=1e-5,
    max_position_embeddings=4096, n_positions=4096, n_ctx=4096, max_seq_len=4096,
    rope_theta=10000.0, tie_word_embeddings=False, sliding_window=8, attention_bias=False,
    num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
    kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16,
    v_head_dim=16, rotary_dim=8, partial_rotary_factor=0.5, query_pre_attn_scalar=16,
    sliding_window_pattern=2, layer_types=["sliding_attention", "full_attention"],
    is_moe_layer=[False, True], norm_topk_prob=True, routed_scaling_factor=1.0,
    num_shared_experts=1, num_shared_expert=1, use_bias=False, use_qkv_bias=False,
    mlp_bias=False, rope_scaling=None, n_group=1, topk_group=1, hidden_act="silu",
    rotary_emb_base=10000.0, rotary_pct=0.25, n_inner=128, shared_intermediate_size=64,
    shared_expert_intermediate_size=64, logits_scaling=1.0, attention_multiplier=0.25,
    embedding_multiplier=1.0, residual_multiplier=1.0, decoder_sparse_step=1,
    mlp_only_layers=[], dim_model_base=64, scale_depth=1.0, scale_emb=1.0,
    num_attention_groups=2, moe_num_experts=4, block_size=4096, rope_parameters=None,
    intermediate_size_mlp=128, no_rope_layers=[1, 1], use_qk_norm=False, moe_topk=2,
    use_mixed_mlp_moe=False, use_cla=False, cla_share_factor=1, group_norm_size=1,
    layer_group_size=1,
)

_ROPE = {"rope_theta": 10000.0, "rope_type": "default", "factor": 1.0,
         "llama_4_scaling_beta": 0.0, "original_max_position_embeddings": 4096}
_YARN = {"type": "yarn", "factor": 1.0, "original_max_position_embeddings": 4096,
         "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}
_MAMBA = dict(state_size=8, conv_kernel=4, use_conv_bias=True, time_step_rank=8, n_groups=1,
              time_step_limit=(0.0, float("inf")), time_step_min=0.001, time_step_max=0.1,
              time_step_floor=1e-4, expand=2, num_heads=8, head_dim=16, chunk_size=8)
_LFM2 = dict(conv_bias=False, conv_L_cache=3, block_dim=64, block_multiple_of=16,
             block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=False,
             full_attn_idxs=[1], layer_types=["conv", "full_attention"])
_LINEAR_ATTN = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                    linear_value_head_dim=16, linear_conv_kernel_dim=4)
# layer 0 latent attention (MLA), layer 1 kimi delta attention
_KIMI_LINEAR = dict(linear_attn_config={"num_heads": 4, "head_dim": 16, "kda_layers": [2],
                                        "short_conv_kernel_size": 4},
                    model_max_length=4096, num_key_value_heads=4, num_experts_per_token=2,
                    first_k_dense_replace=1)
_LONGCAT = dict(expert_ffn_hidden_size=64, zero_expert_num=2, q_lora_rank=16,
                mla_scale_q_lora=True, mla_scale_kv_lora=True)
OVERRIDES: dict[str, dict] = {
    # its head writes -inf at fixed ids up to 100351
    "phi3small": dict(vocab_size=100352, dense_attention_every_n_layers=2,
                      ff_intermediate_size=128, gegelu_limit=20.0),
    "deepseek_v2": dict(rope_scaling=_YARN),
    "minicpm3": dict(q_lora_rank=32, rope_scaling=_YARN),
    "deepseek_v32": dict(q_lora_rank=32, index_head_dim=16, index_n_heads=2, index_topk=4),
    "deepseek_v41": dict(q_lora_rank=32),
    "ministral3": dict(rope_parameters=_ROPE),
    # Wrappers without make_cache: mlx-lm gives them full KVCaches, so a sliding layer type
    # would be masked by the model alone (refused: the paged path follows the cache kind).
    "mistral3": dict(rope_parameters=_ROPE, layer_types=["full_attention"] * 2),
    "pixtral": dict(layer_types=["full_attention"] * 2),
    "smollm3": dict(layer_types=["full_attention"] * 2),
    "mistral4": dict(rope_parameters=_ROPE, q_lora_rank=32),
    "hunyuan": dict(rope_scaling={"alpha": 1.0, "factor": 1.0, "type": "dynamic"}),
    "apertus": dict(post_norm=False, qk_norm=True),
    "exaone4": dict(sliding_window_pattern="LG"),
    "gemma4_text": dict(num_kv_shared_layers=0, global_head_dim=32),
    "gemma4": dict(num_kv_shared_layers=0, global_head_dim=32),
    "plamo": dict(n_shared_head=2),
    "step3p5": dict(num_experts_per_tok=2, moe_top_k=2, moe_num_experts=4),
    "dbrx": dict(attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
                 ffn_config={"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2}),
    "openelm": dict(num_transformer_layers=2, ffn_dim_divisor=8, num_query_heads=[4, 4],
                    num_kv_heads=[2, 2], ffn_multipliers=[1.0, 1.0], model_dim=64,
                    head_dim=16),
    "mamba": _MAMBA,
    "mamba2": _MAMBA,
    "recurrent_gemma": dict(conv1d_width=4, logits_soft_cap=30.0, attention_window_size=8,
                            block_types=["recurrent", "attention"], lru_width=64),
    "qwen3_next": dict(linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=16,
                       linear_value_head_dim=16, linear_conv_kernel_dim=4,
                       full_attention_interval=2),
    "nemotron_h": dict(mamba_num_heads=4, mamba_head_dim=16, mamba_proj_bias=False,
                       ssm_state_size=8, conv_kernel=4, n_groups=1, use_conv_bias=True,
                       hybrid_override_pattern="M*", time_step_limit=(0.0, float("inf")),
                       chunk_size=8),
    "jamba": dict(attn_layer_offset=1, attn_layer_period=2, expert_layer_offset=1,
                  expert_layer_period=2, mamba_d_conv=4, mamba_d_state=8, mamba_expand=2,
                  mamba_dt_rank=8),
    "afm7": dict(num_kv_reuse_layers=1, num_layers=3),
    "mellum": dict(rope_parameters={"sliding_attention": _ROPE, "full_attention": _ROPE}),
    "granitemoehybrid": dict(layer_types=["mamba", "attention"], mamba_n_heads=4,
                             mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8,
                             mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8,
                             mamba_conv_bias=True, mamba_proj_bias=False,
                             position_embedding_type="rope"),
    "lfm2": dict(_LFM2),
    "baichuan_m1": dict(sliding_window_layers=[0], conv_window=2),
    # layer 0 gated linear attention (ArraysCache), layer 1 global attention
    "bailing_moe_linear": dict(layer_group_size=2, num_key_value_heads=4),
    "gemma3n": dict(num_hidden_layers=4, num_kv_shared_layers=2, vocab_size_per_layer_input=VOCAB,
                    rope_local_base_freq=10000.0, final_logit_softcapping=30.0,
                    layer_types=["sliding_attention", "full_attention"] * 2,
                    activation_sparsity_pattern=[0.0] * 4, hidden_size_per_layer_input=16,
                    altup_num_inputs=4, altup_coef_clip=120.0, altup_correct_scale=True,
                    altup_active_idx=0, laurel_rank=8),
    "glm_moe_dsa": dict(index_head_dim=16, index_n_heads=2, index_topk=16, q_lora_rank=32,
                        topk_method="noaux_tc", scoring_func="sigmoid", moe_layer_freq=1,
                        num_key_value_heads=4, rope_parameters=_ROPE),
    "kimi_linear": dict(_KIMI_LINEAR),
    "kimi_k3": dict(_KIMI_LINEAR, hidden_act="situ", num_experts_per_token=2),
    "lfm2-vl": dict(_LFM2),
    "lfm2_moe": dict(_LFM2, use_expert_bias=True, num_dense_layers=1),
    # 4 layers so the chunked-local / global pattern has a global layer (index 3)
    "llama4": dict(attention_chunk_size=8, interleave_moe_layer_step=2, num_hidden_layers=4,
                   num_local_experts=2, num_experts_per_tok=1, use_qk_norm=True),
    "longcat_flash": dict(_LONGCAT, attention_method="MLA", zero_expert_type="identity"),
    "longcat_flash_ngram": dict(_LONGCAT, ngram_vocab_size_ratio=4, emb_neighbor_num=2,
                                emb_split_num=2),
    "mimo_v2_flash": dict(hybrid_layer_pattern=[1, 0], moe_layer_freq=[0, 1],
                          add_swa_attention_sink_bias=True, add_full_attention_sink_bias=False,
                          sliding_window_size=8, topk_method="noaux_tc",
                          scoring_func="sigmoid", layernorm_epsilon=1e-5,
                          swa_rope_theta=1000.0, swa_num_attention_heads=4,
                          swa_num_key_value_heads=2, swa_head_dim=16, swa_v_head_dim=16),
    # one block of each kind: grouped attention, no attention, attention replaced by a linear
    # builds; mlx-lm runs it only through a Metal kernel
    "muse_spark": dict(post_norm_eps=1e-5, rope_parameters=_ROPE, layer_rope_theta=[1e4, 0],
                       final_logit_softcapping=30.0, output_multiplier=1.0,
                       moe_hidden_size=32, num_shared_experts=0, mlp_layer_types=None),
    "nemotron-nas": dict(num_hidden_layers=3, block_configs=[
        {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 2.0}},
        {"attention": {"no_op": True}, "ffn": {"ffn_mult": 1.0}},
        {"attention": {"replace_with_linear": True}, "ffn": {"ffn_mult": 1.5}}]),
    "olmo_hybrid": dict(_LINEAR_ATTN, linear_allow_neg_eigval=True,
                        layer_types=["linear_attention", "full_attention"]),
    "qwen": dict(intermediate_size=256, kv_channels=16),
    "qwen3_5": dict(_LINEAR_ATTN, full_attention_interval=2, layer_types=None),
    "qwen3_5_moe": dict(_LINEAR_ATTN, full_attention_interval=2, layer_types=None),
    "rwkv7": dict(a_low_rank_dim=8, v_low_rank_dim=8, gate_low_rank_dim=16,
                  decay_low_rank_dim=8),
    "spark2_5": dict(hidden_act="gelu",
                     rope_parameters={"sliding_attention": _ROPE, "full_attention": _ROPE}),
}


def architectures() -> list[str]:
    """Every model module of the installed mlx-lm, sorted."""
    return sorted(m.name for m in pkgutil.iter_modules(mlx_lm.models.__path__)
                  if m.name not in _HELPERS)


def config(name: str) -> dict:
    """The tiny configuration dict of architecture ``name``."""
    cfg = {**BASE, **OVERRIDES.get(name, {}), "model_type": name}
    inner = {"gemma3": "gemma3_text", "mistral3": "ministral3", "pixtral": "llama",
             "qwen2_vl": "qwen2", "qwen3_vl": "qwen3", "qwen3_vl_moe": "qwen3_moe",
             "lfm2-vl": "lfm2", "llama4": "llama4_text"}.get(name, name)
    cfg.setdefault("text_config", {**BASE, **OVERRIDES.get(name, {}), "model_type": inner})
    return cfg


def build(name: str, seed: int = 0, **overrides):
    """A tiny random model of ``name`` (float32, weights scaled so greedy tokens vary);
    ``overrides``: configuration fields to change (e.g. ``head_dim``).

    Raises:
        Exception: Whatever mlx-lm raises when the configuration does not fit.
    """
    module = importlib.import_module(f"mlx_lm.models.{name}")
    mx.random.seed(seed)
    args = module.ModelArgs.from_dict({**config(name), **overrides})
    model = module.Model(args)
    if hasattr(model, "sanitize"):
        from mlx.utils import tree_flatten

        model.load_weights(list(model.sanitize(dict(tree_flatten(model.parameters()))).items()),
                           strict=False)
    _scale_weights(model)
    return model


ARCHS = architectures()
