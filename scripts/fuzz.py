"""Nightly input fuzzing: the invariants of ``tests/fuzz_inputs.py`` on many more examples
than CI runs.

    nice -n 19 python scripts/fuzz.py --examples 10000 [--seed N]

Prints how many examples ran and their outcomes (format, exit status); on a broken
invariant, hypothesis' shrunk example and the error, exit status 1.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402

from tests.fuzz_inputs import Case, cases, check_case  # noqa: E402
from tests.test_fuzz import MODEL, TOK  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    outcomes: collections.Counter = collections.Counter()
    start = time.time()

    @seed(args.seed)
    @settings(max_examples=args.examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=cases)
    def prop(case: Case) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            result = check_case(case, Path(tmp), MODEL, TOK)
        outcomes[f"{case.fmt} {result.split(' ')[0]} {result.split(' ')[1]}"] += 1
        outcomes["rows ran"] += int(result.split("ran=")[1].split()[0]) if "ran=" in result else 0
        outcomes["rows failed"] += int(result.split("failed=")[1]) if "failed=" in result else 0
        done = sum(v for k, v in outcomes.items() if not k.startswith("rows"))
        if done % 500 == 0:
            print(f"{done} examples, {time.time() - start:.0f} s: {dict(outcomes)}", flush=True)

    try:
        prop()
        status = 0
    except Exception as e:  # a broken invariant: hypothesis printed the shrunk example
        import traceback

        traceback.print_exception(e, limit=-3, file=sys.stderr)
        status = 1
    total = sum(v for k, v in outcomes.items() if not k.startswith("rows"))
    print(f"seed {args.seed}: {total} examples in {time.time() - start:.0f} s")
    for key, count in sorted(outcomes.items()):
        print(f"  {key}: {count}")
    return status


if __name__ == "__main__":
    sys.exit(main())
