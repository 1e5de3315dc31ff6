"""``mlxpa bench``: workloads (:mod:`~mlxpa.bench.workloads`), the systems timed on them
(:mod:`~mlxpa.bench.systems`) and the report (:mod:`~mlxpa.bench.report`)."""
