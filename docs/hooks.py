"""mkdocs hooks for posemb's site (named in mkdocs.yml).

The command-line reference is written from the argparse parser itself when the site is built,
so it cannot drift from the code: ``docs/cli.md`` holds the prose and a marker, and
:func:`on_page_markdown` replaces the marker with every subcommand's ``--help``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

MARKER = "<!-- posemb-cli-reference -->"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise RuntimeError("posemb's parser has no subcommands")


def cli_reference() -> str:
    """Markdown: ``posemb --help`` and each subcommand's help, as argparse prints them."""
    from posemb import cli

    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal; the page has one width
    parser = cli.build_parser()
    parts = ["```text", parser.format_help().rstrip(), "```"]
    for name, sub in _subparsers(parser).items():
        parts += ["", f"### `posemb {name}`", "", "```text", sub.format_help().rstrip(), "```"]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_reference())
    return markdown
