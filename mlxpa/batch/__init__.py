"""The file run, ``mlxpa run`` as one pipeline: the library call (:mod:`~mlxpa.batch.run`),
pass 1 (:mod:`~mlxpa.batch.validation`), rows to requests (:mod:`~mlxpa.batch.requests`,
:mod:`~mlxpa.batch.prompts`: through :mod:`mlxpa.inputs`), pass 2 (:mod:`~mlxpa.batch.job`),
the engine sized to the input (:mod:`~mlxpa.batch.setup`), the final report
(:mod:`~mlxpa.batch.report`); ``mlxpa plan`` (:mod:`~mlxpa.batch.plan`) predicts such a run.
"""
