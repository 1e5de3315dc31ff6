"""mlx-lm LoRA / DoRA adapters (``--adapter-path``), applied with mlx-lm's own loader.

An adapter folder is what ``mlx_lm.lora`` writes: ``adapter_config.json`` (``fine_tune_type``
``lora``, ``dora`` or ``full``; ``num_layers``; ``lora_parameters`` with ``rank``, ``scale``,
``dropout`` and optionally ``keys``) and ``adapters.safetensors``. It is applied exactly as
``mlx_lm.load(model, adapter_path=...)`` does (``mlx_lm.utils.load_adapters``, then
``model.eval()``), so outputs match mlx-lm's. A fused model (``mlx_lm.fuse``) is a plain
model folder and needs no adapter. :func:`check_adapter_path` reads only the config, so the
command line refuses a bad folder before any input is read.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from mlxpa.loader.json_file import read_json_object
from mlxpa.loader.spelling import option

if TYPE_CHECKING:
    import mlx.nn as nn

logger = logging.getLogger(__name__)

CONFIG = "adapter_config.json"
WEIGHTS = "adapters.safetensors"
FINE_TUNE_TYPES = ("lora", "dora", "full")
_LORA_KEYS = ("rank", "scale", "dropout")


def check_adapter_path(path: str | Path) -> Path:
    """Check that ``path`` is an mlx-lm adapter folder, reading only its config.

    Returns:
        The folder.

    Raises:
        FileNotFoundError: The folder, its ``adapter_config.json`` or its
            ``adapters.safetensors`` does not exist (the path named).
        ValueError: The config is not JSON, or lacks a field mlx-lm's loader reads (named).
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"{option('adapter_path', path)}: no such folder (mlx_lm.lora "
                                f"writes {WEIGHTS} and {CONFIG} into its --adapter-path)")
    for name in (CONFIG, WEIGHTS):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{option('adapter_path', path)}: no {name} in the folder "
                                    f"(an mlx-lm adapter folder holds {WEIGHTS} and {CONFIG})")
    where = folder / CONFIG
    config = read_json_object(where)
    kind = config.get("fine_tune_type", "lora")
    if kind not in FINE_TUNE_TYPES:
        raise ValueError(f"{where}: fine_tune_type must be one of {', '.join(FINE_TUNE_TYPES)}, "
                         f"got {kind!r}")
    if kind != "full":
        if not isinstance(config.get("num_layers"), int):
            raise ValueError(f"{where}: num_layers must be an integer (the layers adapted, "
                             "counted from the last)")
        params = config.get("lora_parameters")
        missing = [k for k in _LORA_KEYS if not isinstance(params, dict) or k not in params]
        if missing:
            raise ValueError(f"{where}: lora_parameters lacks {', '.join(missing)} (mlx-lm's "
                             "LoRA config names the scale 'scale', not 'alpha')")
    return folder


def apply_adapters(model: nn.Module, path: str | Path) -> nn.Module:
    """``model`` with the adapter at ``path`` applied, as ``mlx_lm.load(adapter_path=)`` does.

    Args:
        model: An mlx-lm model, float or quantized (LoRA/DoRA wrap quantized layers too).
        path: The adapter folder.

    Returns:
        The same model object, in eval mode.

    Raises:
        FileNotFoundError, ValueError: As :func:`check_adapter_path`; ``ValueError`` too when
            the adapter does not fit the model (its tensors' names or shapes) or its weights
            file cannot be read, naming the path.
    """
    from mlx_lm.utils import load_adapters

    folder = check_adapter_path(path)
    try:
        model = load_adapters(model, str(folder))
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        detail = " ".join(str(err).split())
        raise ValueError(f"{option('adapter_path', path)}: does not fit the model ({detail})"
                         ) from None
    except RuntimeError as err:  # mx.load: a save cut short, a Git LFS pointer
        detail = " ".join(str(err).split())
        raise ValueError(f"{option('adapter_path', path)}: {WEIGHTS} cannot be read as "
                         f"safetensors ({detail})") from None
    model.eval()
    config = read_json_object(folder / CONFIG)
    logger.info("Applied the %s adapter %s%s", config.get("fine_tune_type", "lora"), folder,
                f" to the last {config['num_layers']} layers"
                if isinstance(config.get("num_layers"), int) else "")
    return model
