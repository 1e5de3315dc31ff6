"""GGUF conversion on tiny synthetic files, checked against independent oracles.

Each GGUF is written with ``gguf.GGUFWriter`` from random weights, converted, loaded with
``mlx_lm.load`` and compared with an mlx-lm model built directly from the same weights (Gemma:
norm weights = stored - 1; llama: Q/K before llama.cpp's permutation) and a hand-written config.
"""

from __future__ import annotations

import json
import os
import time

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from mlx_lm.models import gemma3_text, llama
from mlx_lm.utils import load

from mlxpa.config import EngineConfig
from mlxpa.loader.gguf import convert_gguf, read_gguf, unpermute_qk
from mlxpa.loader.models import MARKER, load_model, resolve_model

H, V_EXTRA = 64, ["\u2581", "a", "b", "c", "\u2581a", "ab", "\u2581ab", "\u2581c", "ca"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]
PROMPT = [2, 100, 265, 266, 267, 50, 264, 30, 263, 266, 265, 200, 10]  # > sliding window


def _vocab(specials: list[str], user_defined: list[str]) -> tuple[list[str], list[int], list]:
    tokens = specials + user_defined + BYTES + V_EXTRA
    types = [3] * len(specials) + [4] * len(user_defined) + [6] * 256 + [1] * len(V_EXTRA)
    scores = [-1000.0] * (len(specials) + len(user_defined)) + [0.0] * 256
    scores += [-float(i) for i in range(len(V_EXTRA))]
    return tokens, types, scores


GEMMA_TOKENS = _vocab(["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
                      ["\n", "  ", "   "])  # fmt: skip
LLAMA_TOKENS = _vocab(["<unk>", "<s>", "</s>"], [])


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py ``LlamaModel.permute``."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_gguf(path, arch, params, tensors, vocab, qtypes=None, model="llama", **tokenizer_kv):
    """Writes a GGUF: ``params`` under ``{arch}.``, float32 ``tensors`` (``qtypes`` picks a
    type per name), a ``vocab`` (tokens, types, scores) of tokenizer ``model`` and
    ``tokenizer.ggml.*`` values (``merges`` a list of strings)."""
    w = gguf.GGUFWriter(path, arch)
    for key, value in params.items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"{arch}.{key}", value)
    tokens, types, scores = vocab
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    for key, value in tokenizer_kv.items():
        if isinstance(value, list):
            w.add_token_merges(value)
        elif isinstance(value, bool):
            w.add_bool(f"tokenizer.ggml.{key}", value)
        elif isinstance(value, str):
            w.add_string(f"tokenizer.{key}", value)
        else:
            w.add_uint32(f"tokenizer.ggml.{key}", value)
    for name, t in tensors.items():
        qtype = (qtypes or {}).get(name, Q.F32)
        if qtype == Q.F32:
            w.add_tensor(name, t)
        elif qtype == Q.F16:
            w.add_tensor(name, t.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def decoded(t: np.ndarray, qtype) -> np.ndarray:
    """What a GGUF of type ``qtype`` holds for ``t`` (independent of mlxpa's reader)."""
    if qtype == Q.F16:
        return t.astype(np.float16).astype(np.float32)
    return gguf.quants.dequantize(gguf.quants.quantize(t, qtype), qtype).reshape(t.shape)


def random_layers(rng, n_layers, heads, kv_heads, head_dim, ffn, names):
    out = {}
    for i in range(n_layers):
        shapes = {
            "attn_q": (heads * head_dim, H), "attn_k": (kv_heads * head_dim, H),
            "attn_v": (kv_heads * head_dim, H), "attn_output": (H, heads * head_dim),
            "ffn_gate": (ffn, H), "ffn_up": (ffn, H), "ffn_down": (H, ffn),
            "attn_norm": (H,), "ffn_norm": (H,), "post_attention_norm": (H,),
            "post_ffw_norm": (H,), "attn_q_norm": (head_dim,), "attn_k_norm": (head_dim,),
        }  # fmt: skip
        for key in names:
            scale = 0.3 if len(shapes[key]) == 1 else shapes[key][-1] ** -0.5
            out[f"blk.{i}.{key}.weight"] = (rng.standard_normal(shapes[key]) * scale).astype(
                np.float32
            )
    return out


HF_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}  # fmt: skip


def oracle_weights(weights: dict, ffn_norm: str) -> dict:
    out = {}
    for name, w in weights.items():
        parts = name.split(".")
        if parts[0] == "blk":
            key = HF_NAMES.get(parts[2], ffn_norm)
            out[f"model.layers.{parts[1]}.{key}.weight"] = mx.array(w)
        else:
            top = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}
            out[f"{top.get(parts[0], 'lm_head')}.weight"] = mx.array(w)
    return out


@pytest.fixture(scope="module")
def gguf_gemma(tmp_path_factory):
    """(gguf path, oracle gemma3_text model) for a 7-layer Gemma 3 with random weights."""
    rng = np.random.default_rng(0)
    tokens = GEMMA_TOKENS[0]
    names = [k for k in HF_NAMES] + ["ffn_norm"]
    true = random_layers(rng, 7, 2, 1, 32, 128, names)
    true["token_embd.weight"] = rng.standard_normal((len(tokens), H)).astype(np.float32) * 0.5
    true["output_norm.weight"] = rng.standard_normal(H).astype(np.float32) * 0.3
    qtypes = {"blk.0.ffn_up.weight": Q.Q8_0, "blk.1.attn_v.weight": Q.F16}
    stored = {k: v + 1.0 if k.endswith("norm.weight") else v for k, v in true.items()}
    params = {
        "context_length": 128, "embedding_length": H, "block_count": 7,
        "feed_forward_length": 128, "attention.head_count": 2, "attention.head_count_kv": 1,
        "attention.key_length": 32, "attention.value_length": 32,
        "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 1e6,
        "attention.sliding_window": 4,
    }  # fmt: skip
    path = write_gguf(tmp_path_factory.mktemp("g") / "gemma.gguf", "gemma3", params, stored,
                      GEMMA_TOKENS, qtypes, bos_token_id=2, eos_token_id=1, unknown_token_id=3,
                      padding_token_id=0, add_bos_token=True, add_space_prefix=False)  # fmt: skip
    for name, qtype in qtypes.items():
        true[name] = decoded(true[name], qtype)
    args = gemma3_text.ModelArgs(
        model_type="gemma3_text", hidden_size=H, num_hidden_layers=7, intermediate_size=128,
        num_attention_heads=2, head_dim=32, rms_norm_eps=1e-6, vocab_size=len(tokens),
        num_key_value_heads=1, rope_theta=1e6, rope_local_base_freq=10000.0,
        query_pre_attn_scalar=32, sliding_window=4, sliding_window_pattern=6,
        max_position_embeddings=128,
    )  # fmt: skip
    model = gemma3_text.Model(args)
    model.load_weights(list(model.sanitize(oracle_weights(true, "pre_feedforward_layernorm"))
                            .items()))  # fmt: skip
    return path, model


@pytest.fixture(scope="module")
def gguf_llama(tmp_path_factory):
    """(gguf path, oracle llama model) for a 2-layer GQA llama with an untied output."""
    rng = np.random.default_rng(1)
    tokens = LLAMA_TOKENS[0]
    names = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
             "attn_norm", "ffn_norm"]  # fmt: skip
    true = random_layers(rng, 2, 4, 2, 16, 96, names)
    true["token_embd.weight"] = rng.standard_normal((len(tokens), H)).astype(np.float32) * 0.5
    true["output_norm.weight"] = 1 + rng.standard_normal(H).astype(np.float32) * 0.3
    true["output.weight"] = rng.standard_normal((len(tokens), H)).astype(np.float32) * 0.2
    stored = dict(true)
    for i in range(2):
        stored[f"blk.{i}.attn_q.weight"] = llama_cpp_permute(true[f"blk.{i}.attn_q.weight"], 4)
        stored[f"blk.{i}.attn_k.weight"] = llama_cpp_permute(true[f"blk.{i}.attn_k.weight"], 2)
    params = {
        "context_length": 256, "embedding_length": H, "block_count": 2,
        "feed_forward_length": 96, "attention.head_count": 4, "attention.head_count_kv": 2,
        "rope.dimension_count": 16, "attention.layer_norm_rms_epsilon": 1e-5,
        "rope.freq_base": 5e5,
    }  # fmt: skip
    path = write_gguf(tmp_path_factory.mktemp("l") / "llama.gguf", "llama", params, stored,
                      LLAMA_TOKENS, bos_token_id=1, eos_token_id=2, unknown_token_id=0,
                      chat_template="{{ messages[0]['content'] }}")  # fmt: skip
    args = llama.ModelArgs(
        model_type="llama", hidden_size=H, num_hidden_layers=2, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
        vocab_size=len(tokens), rope_theta=5e5, tie_word_embeddings=False,
    )  # fmt: skip
    model = llama.Model(args)
    model.load_weights(list(oracle_weights(true, "post_attention_layernorm").items()))
    return path, model


@pytest.mark.parametrize("which", ["gguf_gemma", "gguf_llama"])
def test_logits_match_oracle(which, request, tmp_path):
    path, oracle = request.getfixturevalue(which)
    model, tokenizer = load(str(convert_gguf(path, tmp_path / "mlx")))
    ids = mx.array([[1 if which == "gguf_llama" else 2] + PROMPT[1:]])
    got, want = model(ids), oracle(ids)
    assert got.dtype == mx.float32
    assert mx.abs(got - want).max().item() < 1e-5
    assert mx.abs(want).max().item() > 0.1  # the comparison is not vacuous


def test_reader_matches_gguf_reader(gguf_gemma):
    path, _ = gguf_gemma
    meta, tensors = read_gguf(path)
    reader = gguf.GGUFReader(path)
    for key, field in reader.fields.items():
        if not key.startswith("GGUF."):
            want = field.contents()
            assert meta[key] == (pytest.approx(want) if isinstance(want, float) else want), key
    assert [t.name for t in reader.tensors] == list(tensors)
    for t in reader.tensors:
        want = gguf.quants.dequantize(t.data, t.tensor_type)
        np.testing.assert_array_equal(tensors[t.name].dequantize(), want.reshape(want.shape))


def test_unpermute_inverts_llama_cpp_permute():
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    np.testing.assert_array_equal(unpermute_qk(llama_cpp_permute(w, 8), 8), w)
    b = np.arange(64, dtype=np.float32)
    np.testing.assert_array_equal(unpermute_qk(llama_cpp_permute(b, 4), 4), b)


def test_gemma_config_and_tokenizer(gguf_gemma, tmp_path):
    path, _ = gguf_gemma
    folder = convert_gguf(path, tmp_path / "mlx")
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["tie_word_embeddings"]
    assert config["eos_token_id"] == [1, 5] and config["rms_norm_eps"] == 1e-6
    assert config["query_pre_attn_scalar"] == 32 and config["rope_local_base_freq"] == 10000.0
    _, tok = load(str(folder))
    assert tok.eos_token_ids == {1, 5} and tok.has_chat_template
    for text in ["ab a", "  ab\n\n c", "abc   ca", "é ☃ x"]:
        ids = tok.encode(text)
        assert ids[0] == 2 and 2 not in ids[1:]
        assert tok.decode(ids[1:]) == text
    assert tok.encode("  ab")[1] == 7  # a run of spaces is its user-defined token
    chat = tok.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        tokenize=False, add_generation_prompt=True,
    )  # fmt: skip
    assert chat == "<bos><start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\n"


def test_llama_keeps_its_chat_template_and_space_prefix(gguf_llama, tmp_path):
    path, _ = gguf_llama
    folder = convert_gguf(path, tmp_path / "mlx")
    assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"] is False
    _, tok = load(str(folder))
    assert tok.chat_template == "{{ messages[0]['content'] }}"
    ids = tok.encode("ab c")
    assert ids[0] == 1 and tok.convert_ids_to_tokens(ids[1:]) == ["\u2581ab", "\u2581c"]
    assert tok.decode(ids[1:]) == "ab c"


def test_byte_level_tokenizer_goes_to_transformers(gguf_llama, tmp_path):
    pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    tokens = ["<|begin|>", "<|end|>", "a", "b", "\u0120", "ab", "\u0120ab"]  # \u0120: a space
    meta, tensors = read_gguf(gguf_llama[0])
    weights = {name: t.dequantize() for name, t in tensors.items()}
    for name in ("token_embd.weight", "output.weight"):
        weights[name] = weights[name][: len(tokens)]
    params = {k.split(".", 1)[1]: v for k, v in meta.items() if k.startswith("llama.")}
    vocab = (tokens, [3, 3, 1, 1, 1, 1, 1], [0.0] * len(tokens))
    path = write_gguf(tmp_path / "bl.gguf", "llama", params, weights, vocab, model="gpt2",
                      merges=["a b", "\u0120 ab"], bos_token_id=0, eos_token_id=1)  # fmt: skip
    _, tok = load(str(convert_gguf(path, tmp_path / "mlx")))
    assert tok.encode("ab ab") == [0, 5, 6] and tok.decode([5, 6]) == "ab ab"


def test_unsupported_architecture(tmp_path):
    tensors = {"token_embd.weight": np.zeros((len(LLAMA_TOKENS[0]), 32), np.float32)}
    path = write_gguf(tmp_path / "q.gguf", "qwen2", {"block_count": 1}, tensors, LLAMA_TOKENS)
    with pytest.raises(ValueError, match=r"architecture 'qwen2' in .*q\.gguf"):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_gguf_is_a_clear_error():
    """(A repo id's cache lookup, download and failures: tests/loader/test_hub.py.)"""
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model("missing/model.gguf")


def test_folder_spec_returns_itself(gguf_llama, tmp_path):
    folder = convert_gguf(gguf_llama[0], tmp_path / "mlx")
    assert resolve_model(str(folder)) == folder
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path / "empty"))


def test_gguf_spec_is_converted_once_into_the_cache(gguf_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    gguf_path = tmp_path / "copy.gguf"
    gguf_path.write_bytes(gguf_llama[0].read_bytes())
    folder = resolve_model(str(gguf_path))
    assert folder.parent == tmp_path / "cache" / "mlxpa" / "models"
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_model(str(gguf_path)) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temp folder left
    marker = json.loads((folder / MARKER).read_text())
    (folder / MARKER).write_text(json.dumps({**marker, "format": -1}))  # an older format
    assert resolve_model(str(gguf_path)) == folder
    assert json.loads((folder / MARKER).read_text()) == marker
    os.utime(gguf_path, ns=(time.time_ns(), time.time_ns() + 10**9))  # the file changed
    assert resolve_model(str(gguf_path)) != folder


def test_load_model_casts(gguf_llama, tmp_path):
    folder = convert_gguf(gguf_llama[0], tmp_path / "mlx", dtype="bfloat16")
    model, tok, path = load_model(EngineConfig(model=str(folder), dtype="bfloat16"))
    assert path == folder and model.model.norm.weight.dtype == mx.bfloat16
    model, _, _ = load_model(EngineConfig(model=str(folder)))
    assert model.model.norm.weight.dtype == mx.float32  # CPU default
    with pytest.raises(ValueError, match="dtype"):
        load_model(EngineConfig(model=str(folder), dtype="int8"))
