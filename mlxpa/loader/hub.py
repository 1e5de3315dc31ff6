"""Hugging Face Hub model ids: the local cache first (no network), else a download.

As mlx-lm's own loader (``mlx_lm.utils._download``) and vLLM do, a repo id that is not on disk
is fetched on first use with ``huggingface_hub.snapshot_download``: only the files mlx-lm loads
(its ``DEFAULT_ALLOW_PATTERNS``: ``*.json``, ``model*.safetensors``, tokenizer files, ...), at
``revision``, into the cache huggingface_hub uses (``HF_HOME`` / ``HF_HUB_CACHE``), with its
progress bars on stderr and its token (``HF_TOKEN``, or ``hf auth login``). The cache is
looked up first with ``local_files_only=True``, so a cached model loads without a request;
with ``HF_HUB_OFFLINE=1`` nothing is ever requested. Every command resolves models through
:func:`mlxpa.loader.models.resolve_model`, so run, plan, bench and the Ray replicas behave
alike.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mlxpa.loader.spelling import option, options

logger = logging.getLogger(__name__)


class HubModelError(FileNotFoundError):
    """A repo id that cannot be had: offline, the Hub unreachable, no such repo or revision,
    gated or private. The message is one line that says which and how to fetch by hand, raised
    without the Hub client's chained exceptions (their tracebacks run to a hundred lines)."""


def hub_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The local snapshot folder of ``repo_id`` at ``revision``, downloaded when not cached.

    Args:
        repo_id: ``owner/name`` on the Hugging Face Hub.
        revision: Branch, tag or commit; None is ``main``.

    Returns:
        The snapshot folder (holds ``config.json`` and the ``model*.safetensors`` weights).

    Raises:
        ValueError: ``repo_id`` is not a valid repo id.
        HubModelError: Not cached and offline (``HF_HUB_OFFLINE``) or the Hub cannot be
            reached; the repo or revision does not exist; the repo is gated or private without
            a token that may read it; or the snapshot holds no MLX model.
    """
    from huggingface_hub.errors import HFValidationError

    try:
        folder = _cached(repo_id, revision)
        if folder is None:
            folder = _download(repo_id, revision)
    except HFValidationError:
        raise ValueError(f"{option('model', repo_id)} is not an MLX folder, a .gguf file or a "
                         "Hugging Face repo id (owner/name)") from None
    return folder


def _allow_patterns() -> list[str]:
    from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

    return list(DEFAULT_ALLOW_PATTERNS)


def _complete(folder: Path) -> bool:
    """A snapshot mlx-lm can load: ``config.json`` and weights (not, say, the tokenizer files
    alone, which ``mlx_lm.utils.load_tokenizer`` fetches on its own)."""
    return (folder / "config.json").is_file() and any(folder.glob("model*.safetensors"))


def _cached(repo_id: str, revision: str | None) -> Path | None:
    """The complete cached snapshot, found without a request; None when there is none."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo_id, revision=revision, local_files_only=True,
                                        allow_patterns=_allow_patterns()))
    except LocalEntryNotFoundError:
        return None
    return folder if _complete(folder) else None


def _download(repo_id: str, revision: str | None) -> Path:
    """``snapshot_download`` of the files mlx-lm loads, each failure one line.

    Raises:
        HubModelError: As :func:`hub_snapshot`.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    named = options(model=repo_id, revision=revision)
    by_hand = f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")
    cache = constants.HF_HUB_CACHE
    if constants.HF_HUB_OFFLINE:
        raise HubModelError(
            f"{named} is not a local folder, not in the Hugging Face cache "
            f"({cache}), and HF_HUB_OFFLINE is set, so it is not downloaded: fetch it where "
            f"a network exists (`{by_hand}`, with the same HF_HOME), or unset HF_HUB_OFFLINE")
    logger.info("Downloading %s%s from the Hugging Face Hub into %s ...", repo_id,
                f" (revision {revision})" if revision else "", cache)
    try:
        folder = Path(snapshot_download(repo_id, revision=revision,
                                        allow_patterns=_allow_patterns()))
    except GatedRepoError:
        raise HubModelError(
            f"{option('model', repo_id)} is a gated repo: accept its terms on "
            f"https://huggingface.co/{repo_id}, then set HF_TOKEN to a token of that account "
            "(or run `hf auth login`)") from None
    except RepositoryNotFoundError:
        raise HubModelError(
            f"{option('model', repo_id)}: no such local folder, and no such model repo on the "
            "Hugging Face Hub (a private repo needs HF_TOKEN set to a token that may read it)"
            ) from None
    except RevisionNotFoundError:
        raise HubModelError(f"{option('model', repo_id)}: the Hub has no revision "
                            f"{revision!r} of it (give a branch, tag or commit of the repo)"
                            ) from None
    except LocalEntryNotFoundError as err:  # the Hub could not be reached
        cause = err.__cause__ or err
        raise HubModelError(
            f"{named} is not a local folder, the Hugging Face Hub cannot be "
            f"reached ({type(cause).__name__}) and it is not in the cache ({cache}); fetch it "
            f"where a network exists (`{by_hand}`) and copy that HF_HOME here, or pass a "
            "local folder") from None
    except HfHubHTTPError as err:
        status = getattr(err.response, "status_code", "?")
        raise HubModelError(f"{named}: the Hugging Face Hub answered HTTP "
                            f"{status}; try again later or fetch it by hand (`{by_hand}`)"
                            ) from None
    except Exception as err:  # a proxy or TLS failure of the HTTP client: still one line
        first = (str(err).splitlines() or [""])[0]
        raise HubModelError(f"{named}: the download failed "
                            f"({type(err).__name__}: {first}); fetch it by hand "
                            f"(`{by_hand}`)") from None
    if not _complete(folder):
        raise HubModelError(f"{named}: the snapshot {folder} has no "
                            "config.json and model*.safetensors weights (not an mlx-lm model "
                            "repo; mlx-lm's convert makes one)")
    logger.info("Downloaded %s to %s", repo_id, folder)
    return folder
