"""Structured outputs (constrained decoding), one package as vLLM's ``v1/structured_output/``.

* :mod:`~mlxpa.structured.spec`: a constraint
  (:class:`~mlxpa.sampling_params.StructuredOutput`) checked by compiling it with llguidance
  (no mlx);
* :mod:`~mlxpa.structured.fields`: the row fields that give a constraint or ask for
  log-probabilities, and the run's ``--choice``/``--json-schema``/``--regex``/``--grammar``
  default (no mlx);
* :mod:`~mlxpa.structured.matchers`: llguidance's tokenizer (built in the background while the
  model loads), one matcher per constrained request, the step's bitmask (owned by the model
  runner);
* :mod:`~mlxpa.structured.mask`: the bitmask applied to the logits in one fused MLX pass.

The constraint types themselves are sampling parameters (:mod:`mlxpa.sampling_params`).
"""
