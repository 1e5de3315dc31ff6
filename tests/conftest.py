"""Shared pytest fixtures."""

from __future__ import annotations

import pytest

import mlxpa  # noqa: F401  (before any test module imports mlx: the fast BLAS in-process)

# --- default model (Gemma 3 270M) fixtures: tests marked real_model ----------------------------


@pytest.fixture(scope="session")
def default_model_dir():
    """The converted default model folder (converted into the user cache on first use)."""
    from mlxpa.loader.models import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="module")
def default_model(default_model_dir):
    """``(model, tokenizer, folder)`` of the default model, float32, loaded once per module
    (a few seconds each; held for the session, its 1.1 GiB would stand under every later
    module's peak)."""
    from mlxpa.config import EngineConfig
    from mlxpa.loader.models import load_model

    return load_model(EngineConfig())


@pytest.fixture(autouse=True, scope="module")
def _release_memory_after_each_module():
    """After each test module, the memory it freed goes back: MLX keeps freed buffers in its
    cache for reuse, so without this a later module's peak stands on every earlier one's."""
    yield
    import gc
    import sys

    gc.collect()
    if "mlx.core" in sys.modules:
        sys.modules["mlx.core"].clear_cache()


def pytest_collection_modifyitems(items) -> None:
    """A test of the default model is a slow one (``pytest -m "not slow"`` leaves it out)."""
    for item in items:
        if item.get_closest_marker("real_model") is not None:
            item.add_marker(pytest.mark.slow)


# --- one line that says why tests were skipped ---------------------------------------------


def pytest_terminal_summary(terminalreporter) -> None:
    """After the run, one line: how many tests skipped, for which reasons (most first)."""
    from collections import Counter

    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.write_line(
            f"skipped {sum(reasons.values())}: "
            + "; ".join(f"{n} {reason}" for reason, n in reasons.most_common()))
