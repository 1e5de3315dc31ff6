"""One child process run and its peak resident set size (``os.wait4``'s ``ru_maxrss``), for the
memory benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
import time


def peak_rss_run(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd`` (stdout discarded; ``env``: its environment, default this one's); returns
    its peak RSS (MiB), wall seconds and exit status."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    # ru_maxrss is in KiB on Linux and bytes on macOS.
    scale = 1 / 1024 if sys.platform.startswith("linux") else 1 / 2**20
    return {"peak_rss_mib": round(usage.ru_maxrss * scale, 1), "wall_s": round(wall, 1),
            "status": os.waitstatus_to_exitcode(status)}
