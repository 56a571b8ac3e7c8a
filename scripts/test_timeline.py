"""Where a test run's time went, per worker: the file ``POSEMB_TEST_TIMELINE`` made (see
tests/conftest.py). Prints each worker's busy seconds and its slowest test modules, each with
the processor seconds it used (its threads' and its subprocesses'), where the file has them.

    POSEMB_TEST_TIMELINE=/tmp/t.txt make test && python scripts/test_timeline.py /tmp/t.txt
"""

from __future__ import annotations

import collections
import math
import sys


def _seconds(value: float, width: int) -> str:
    """``value`` as seconds, or "-" for a timeline written before it recorded them (NaN)."""
    return "-".rjust(width + 2) if math.isnan(value) else f"{value:{width}.1f} s"


def main(argv: list[str]) -> int:
    """Read the timeline at ``argv[0]``; print a summary; 0."""
    rows = []
    with open(argv[0]) as f:
        for line in f:
            worker, start, end, rest = line.rstrip("\n").split(" ", 3)
            cpu, nodeid = rest.split(" ", 1) if not rest.startswith("tests/") else ("nan", rest)
            rows.append((worker, float(start), float(end), float(cpu), nodeid.split("::", 1)[0]))
    first = min(r[1] for r in rows)
    last = max(r[2] for r in rows)
    print(f"{len(rows)} tests over {last - first:.0f} s")
    for worker in sorted({r[0] for r in rows}):
        mine = sorted((r for r in rows if r[0] == worker), key=lambda r: r[1])
        busy = sum(r[2] - r[1] for r in mine)
        cpu = sum(r[3] for r in mine)
        ends = mine[-1][2] - first
        print(f"{worker}: busy {busy:.0f} s, cpu {_seconds(cpu, 0)}, ends at {ends:.0f} s")
        modules: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 1e18, 0.0, 0.0])
        for _, start, end, used, module in mine:
            m = modules[module]
            m[0] += end - start
            m[1] = min(m[1], start - first)
            m[2] = max(m[2], end - first)
            m[3] += used
        print("   from -    to    wall     cpu  module")
        for module, (spent, begin, finish, used) in sorted(
            modules.items(), key=lambda kv: kv[1][1]
        ):
            if spent >= 5 or used >= 5:
                print(
                    f"  {begin:6.0f}-{finish:6.0f} s  {spent:6.1f} s {_seconds(used, 6)}  {module}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
