"""`blockir check FILE…`: parse and verify; print diagnostics; exit 0, 1 (errors) or 2 (unreadable)."""
from __future__ import annotations

import argparse
import sys

from blockir.cli import EXIT_ERRORS, EXIT_OK, emit, load_file, summary
from blockir.diagnostics import Diagnostic


def run(args: argparse.Namespace) -> int:
    sources: dict[str, str] = {}
    all_diags: list[Diagnostic] = []
    worst = EXIT_OK
    for path in args.files:
        _, diags, io_code = load_file(path, sources)
        emit(diags, sources)
        all_diags += diags
        worst = max(worst, io_code)
    failed = any(d.is_error for d in all_diags) or (args.werror and any(d.severity == "warning" for d in all_diags))
    print(summary(all_diags, len(args.files)), file=sys.stderr)
    return worst if worst else (EXIT_ERRORS if failed else EXIT_OK)


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("check", help="parse and verify files; print diagnostics")
    c.add_argument("files", nargs="+", metavar="FILE")
    c.add_argument("--werror", action="store_true", help="treat warnings as errors")
    c.set_defaults(func=run)
