"""mlx-lm LoRA and DoRA adapters (``--adapter-path``): greedy output token-identical to
mlx-lm's ``load(model, adapter_path=...)`` + ``generate_step``, on a float and a 4-bit base;
a bad adapter folder is refused naming the path, before any row runs."""

from __future__ import annotations

import json
import logging

import mlx.core as mx
import pytest
from mlx_lm import generate, load
from mlx_lm.utils import dequantize_model
from typer.testing import CliRunner

from mlxpa.cli import app
from mlxpa.config import EngineConfig
from mlxpa.loader.adapters import check_adapter_path
from mlxpa.loader.models import load_model
from tests.loader.folders import (
    engine_for,
    engine_greedy,
    mlx_lm_greedy,
    tiny_folders,
    write_adapter,
)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    found = tiny_folders(root)
    for kind in ("lora", "dora"):
        found[kind] = write_adapter(root / kind, found["float"], kind)
    return found


@pytest.mark.parametrize("kind", ["lora", "dora"])
def test_float_base_matches_mlx_lm(folders, kind):
    model, tok = load(folders["float"], adapter_path=folders[kind])
    want = mlx_lm_greedy(model, tok)
    got = engine_greedy(engine_for(folders["float"], adapter_path=folders[kind]))
    assert got == want
    plain = mlx_lm_greedy(*load(folders["float"]))
    assert want != plain  # the adapter changes the output: the comparison can fail


@pytest.mark.parametrize("kind", ["lora", "dora"])
def test_quantized_base_matches_mlx_lm(folders, kind):
    """On the CPU the packed base is dequantized after the adapter is applied: the oracle is
    mlx-lm's adapted model passed through mlx-lm's own ``dequantize_model``; with
    ``keep_quantized`` it is mlx-lm's adapted packed model as loaded."""
    model, tok = load(folders["q4"], adapter_path=folders[kind])
    packed = mlx_lm_greedy(model, tok)
    got = engine_greedy(engine_for(folders["q4"], adapter_path=folders[kind],
                                   keep_quantized=True))
    assert got == packed
    dequantize_model(model)
    want = mlx_lm_greedy(model, tok)
    assert engine_greedy(engine_for(folders["q4"], adapter_path=folders[kind])) == want
    assert want != mlx_lm_greedy(*load(folders["q4"]))


def test_adapter_layers_wrap_the_quantized_layers(folders):
    """What mlx-lm builds: LoRA layers around the base's packed layers inside the adapted
    blocks; the embedding (outside them) stays packed; eval mode (no dropout)."""
    model, _, _ = load_model(EngineConfig(model=folders["q4"], adapter_path=folders["lora"],
                                          keep_quantized=True))
    q = model.model.layers[-1].self_attn.q_proj
    assert type(q).__name__ == "LoRALinear" and type(q.linear).__name__ == "QuantizedLinear"
    assert not model.training
    assert type(model.model.embed_tokens).__name__ == "QuantizedEmbedding"


def _config(folder, **changes):
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_bad_adapter_folders_name_the_path(folders, tmp_path):
    with pytest.raises(FileNotFoundError, match=f"--adapter-path {tmp_path}/none: no such"):
        check_adapter_path(tmp_path / "none")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no adapter_config.json in the folder"):
        check_adapter_path(empty)
    bad = tmp_path / "bad"
    write_adapter(bad, folders["float"], "lora")
    _config(bad, lora_parameters={"rank": 4, "alpha": 16, "dropout": 0.0})
    with pytest.raises(ValueError, match=r"adapter_config.json: lora_parameters lacks scale"):
        check_adapter_path(bad)
    _config(bad, fine_tune_type="qlora")
    with pytest.raises(ValueError, match="fine_tune_type must be one of lora, dora, full"):
        check_adapter_path(bad)
    (bad / "adapter_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON file"):
        check_adapter_path(bad)


def test_adapter_that_does_not_fit_the_model(folders, tmp_path):
    """An adapter for another model (other shapes) fails at load, naming the path."""
    other = tmp_path / "other"
    write_adapter(other, folders["float"], "lora")
    weights = mx.load(str(other / "adapters.safetensors"))
    name = next(k for k in weights if k.endswith("lora_a"))
    weights[name] = mx.zeros((weights[name].shape[0] + 1, weights[name].shape[1]))
    mx.save_safetensors(str(other / "adapters.safetensors"), weights)
    with pytest.raises(ValueError, match=f"--adapter-path {other}: does not fit the model"):
        load_model(EngineConfig(model=folders["float"], adapter_path=str(other)))


def test_cli_refuses_a_missing_adapter_before_reading_rows(folders, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "hi"}\n')
    out = tmp_path / "out.jsonl"
    r = CliRunner().invoke(app, ["run", str(rows), "-o", str(out), "--model", folders["float"],
                                 "--adapter-path", str(tmp_path / "nope"), "-q"])
    assert r.exit_code == 2
    assert f"--adapter-path {tmp_path}/nope: no such folder" in r.output
    assert not out.exists()


def test_cli_run_with_an_adapter(folders, tmp_path, caplog):
    """``mlxpa run --adapter-path``: the texts mlx-lm's adapted model generates, and a line
    that says the adapter was applied."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("hello", "abc")))
    out = tmp_path / "out.jsonl"
    with caplog.at_level(logging.INFO, logger="mlxpa.loader.adapters"):
        r = CliRunner().invoke(app, ["run", str(rows), "-o", str(out), "--model",
                                     folders["float"], "--adapter-path", folders["dora"],
                                     "--max-tokens", "6", "-q"])
    assert r.exit_code == 0, r.output
    assert [rec.getMessage() for rec in caplog.records] == [
        f"Applied the dora adapter {folders['dora']} to the last 2 layers"]
    model, tok = load(folders["float"], adapter_path=folders["dora"])
    want = [generate(model, tok, p, max_tokens=6) for p in ("hello", "abc")]
    got = [json.loads(line)["text"] for line in out.read_text().splitlines()]
    assert got == want


@pytest.mark.parametrize("content", [b"", b"version https://git-lfs.github.com/spec/v1\n"],
                         ids=["empty", "lfs-pointer"])
def test_unreadable_adapter_weights_name_the_file(folders, tmp_path, content):
    """An adapters.safetensors that is not one (a save cut short, a Git LFS pointer) fails at
    load naming the path and the file, as a misfitting one does (it was a RuntimeError
    traceback from mx.load); the CLI prints one line and exits 1."""
    bad = tmp_path / "cut"
    write_adapter(bad, folders["float"], "lora")
    (bad / "adapters.safetensors").write_bytes(content)
    with pytest.raises(ValueError, match=f"--adapter-path {bad}: adapters.safetensors cannot "
                       "be read as safetensors"):
        load_model(EngineConfig(model=folders["float"], adapter_path=str(bad)))
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "hi"}\n')
    r = CliRunner().invoke(app, ["run", str(rows), "-o", str(tmp_path / "out.jsonl"),
                                 "--model", folders["float"], "--adapter-path", str(bad), "-q"])
    assert r.exit_code == 1, r.output
    assert f"error: --adapter-path {bad}: adapters.safetensors cannot be read" in r.output
    assert "Traceback" not in r.output
