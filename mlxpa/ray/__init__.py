"""Scale-out on Ray (``pip install 'mlxpa[ray]'``).

* :func:`mlxpa.ray.run.run_file_ray`: ``mlxpa run INPUT -o OUTPUT --ray``: the rows of a file
  on N engine replicas (a pool of Ray actors the driver feeds as it streams the input),
  written as a local run writes them;
* :func:`build_processor`: a ``Dataset -> Dataset`` callable for users who already hold a Ray
  Dataset (the shape of ``ray.data.llm.build_llm_processor``; a Ray Data actor pool).

Each replica is a Ray actor that owns one :class:`~mlxpa.engine.LLMEngine`, built once.
This package is ``mlxpa.ray``; its modules import Ray as ``import ray`` (absolute imports), so
it never shadows the ``ray`` package.
"""

from __future__ import annotations

from mlxpa.ray.processor import build_processor

__all__ = ["build_processor"]
