"""The file run, ``mlxpa run`` as one pipeline: the library call (:mod:`~mlxpa.batch.run`),
pass 2 (:mod:`~mlxpa.batch.job`), rows to token ids (:mod:`~mlxpa.batch.prompts`), the engine
sized to the input (:mod:`~mlxpa.batch.setup`), the progress bar and final report
(:mod:`~mlxpa.batch.progress`); ``mlxpa plan`` (:mod:`~mlxpa.batch.plan`) predicts such a run.
"""
