"""The ``posemb`` command: one subcommand per job.

Errors in what the user typed exit with status 2 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence


def _verdict_note(row: dict[str, object]) -> str:
    verdict = row["verdict"]
    if verdict in ("holds", "n/a"):
        return ""
    return f"lesson {verdict}: it says \u201c{row['lesson_says']}\u201d"


def format_table(rows: list[dict[str, object]], width: int = 100) -> str:
    """Render claim rows as a plain-text table: result, id and claim, then what was measured."""
    passed = sum(bool(r["passed"]) for r in rows)
    corrected = sum(r["verdict"] not in ("holds", "n/a") for r in rows)
    lines = [
        f"posemb verify: {passed}/{len(rows)} claims hold as measured; "
        f"the lesson is wrong or imprecise on {corrected} of them.",
        "",
    ]
    indent = " " * 7
    for r in rows:
        mark = "PASS" if r["passed"] else "FAIL"
        lines.append(f"{mark}   {r['id']}")
        for key, text in (("", r["claim"]), ("measured: ", r["measured"])):
            lines += textwrap.wrap(
                f"{key}{text}", width, initial_indent=indent, subsequent_indent=indent + "  "
            )
        note = _verdict_note(r)
        if note:
            lines += textwrap.wrap(
                note, width, initial_indent=indent, subsequent_indent=indent + "  "
            )
    return "\n".join(lines)


def _cmd_verify(args: argparse.Namespace) -> int:
    from .lesson.claims import run_all

    rows = run_all()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(format_table(rows))
    return 0 if all(r["passed"] for r in rows) else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``posemb`` command."""
    parser = argparse.ArgumentParser(
        prog="posemb",
        description="Positional encodings for transformers: checked claims, tables, tools.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    verify = sub.add_parser(
        "verify",
        help="check the lesson's mathematical claims and print what was measured",
        description="Run every claim of the positional-embedding lesson as a check. "
        "Exit status 1 if any check fails.",
    )
    verify.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list of {id, claim, passed, measured, ...} instead of a table",
    )
    verify.set_defaults(func=_cmd_verify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``posemb`` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ValueError as err:
        print(f"posemb {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
