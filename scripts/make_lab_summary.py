"""Regenerate ``src/posemb/lab/data/default_summary.json``, the compact summary of the default
lab run that ships with posemb, from the full run in ``docs/lab/results.json``:

    python scripts/make_lab_summary.py [RESULTS_JSON]

It keeps what the lesson's claims read (:func:`posemb.lab.report.compact`); after a new default
run (``posemb lab --out DIR``; copy its results.json,
results.md and plots to docs/lab) run this, then the tests, which check that the
shipped file equals ``compact`` of ``docs/lab/results.json``.
"""

from __future__ import annotations

import os
import sys

from posemb.lab import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str]) -> int:
    results = argv[0] if argv else os.path.join(ROOT, "docs", "lab", "results.json")
    out = os.path.join(ROOT, "src", "posemb", "lab", "data", report.DEFAULT_SUMMARY)
    print("wrote", report.write_default_summary(results, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
