"""Regenerate a compact lab summary that ships with posemb from the full run in ``docs/lab``:

    python scripts/make_lab_summary.py [RESULTS_JSON]                  # the default suite
    python scripts/make_lab_summary.py --suite recent [RESULTS_JSON]   # posemb lab --suite recent

The default suite's summary is ``src/posemb/lab/data/default_summary.json`` (from
``docs/lab/results.json``); the recent suite's is ``recent_summary.json`` (from
``docs/lab/recent/results.json``). Each keeps what the lesson's claims read
(:func:`posemb.lab.report.compact`). After a new run (``posemb lab --out DIR``; copy its
results.json, results.md and plots to docs/lab, or docs/lab/recent) run this, then the tests,
which check that each shipped file equals ``compact`` of its results.json.
"""

from __future__ import annotations

import argparse
import os
import sys

from posemb.lab import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = {
    "classic": os.path.join(ROOT, "docs", "lab", "results.json"),
    "recent": os.path.join(ROOT, "docs", "lab", "recent", "results.json"),
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", help="a sweep's results.json")
    parser.add_argument("--suite", choices=sorted(report.SHIPPED_SUMMARIES), default="classic")
    args = parser.parse_args(argv)
    out = os.path.join(ROOT, "src", "posemb", "lab", "data", report.SHIPPED_SUMMARIES[args.suite])
    results = args.results or RESULTS[args.suite]
    print("wrote", report.write_default_summary(results, out, suite=args.suite))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
