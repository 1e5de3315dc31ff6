"""Memory and time of putting a resumed JSONL output back in input order (``--resume``).

Writes an output of ``--rows`` result lines in the worst order for the rewrite: an earlier run
wrote the odd rows, the resumed run appended the even ones, so no two neighbouring lines stay
together and every line is its own byte range. Then times
:func:`mlxpa.data.order.jsonl_in_order` and reports the growth of the process's peak resident
set size (``ru_maxrss``) during it, beyond the ``positions`` map the validation pass builds
anyway; every 100,000th line is checked. Run from the repository root::

    python benchmarks/resume_order_memory.py                 # 1,000,000 rows
    python benchmarks/resume_order_memory.py --rows 100000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from array import array

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mlxpa.data.order import jsonl_in_order  # noqa: E402

RECORD = {"text": "x" * 60, "finish_reason": "stop", "prompt_tokens": 30,
          "completion_tokens": 12, "cached_tokens": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    n = parser.parse_args().rows
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "out.jsonl")
        with open(path, "w") as f:
            for i in range(1, n, 2):  # the earlier run
                f.write(json.dumps({"id": f"r{i}", **RECORD}) + "\n")
            base_end = f.tell()
            for i in range(0, n, 2):  # the resumed run
                f.write(json.dumps({"id": f"r{i}", **RECORD}) + "\n")
        positions = {f"r{i}": i for i in range(1, n, 2)}
        new_index = array("q", range(0, n, 2))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        assert jsonl_in_order(path, positions, base_end, new_index)
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        size = os.path.getsize(path)
        with open(path) as f:
            for i, line in enumerate(f):
                if i % 100_000 == 0:
                    assert json.loads(line)["id"] == f"r{i}", i
    print(f"{n} rows, {size / 2**20:.0f} MiB: rewritten in input order in {seconds:.1f} s; "
          f"peak RSS grew {(after - before) / 1024:.0f} MiB (from {before / 1024:.0f} MiB)")


if __name__ == "__main__":
    main()
