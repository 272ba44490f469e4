"""`blockir check FILE…`: parse and verify; print diagnostics; exit 0, 1 (errors) or 2 (unreadable).

Diagnostics go to stderr, as a compiler's do; with ``--format json`` the list of diagnostics is
the report and goes to stdout.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from blockir.cli import EXIT_ERRORS, EXIT_OK, add_format_option, emit, load_file, print_json, summary, where
from blockir.diagnostics import Diagnostic


def diagnostic_data(d: Diagnostic) -> dict[str, Any]:
    return {"location": where(d.span), "file": d.span.filename, "line": d.span.line, "column": d.span.column,
            "severity": d.severity, "code": d.code, "message": d.message, "hint": d.hint,
            "notes": [{"location": where(n.span) if n.span else None, "message": n.message} for n in d.notes]}


def run(args: argparse.Namespace) -> int:
    sources: dict[str, str] = {}
    all_diags: list[Diagnostic] = []
    worst = EXIT_OK
    for path in args.files:
        _, diags, io_code = load_file(path, sources)
        if args.format == "text":
            emit(diags, sources)
        all_diags += diags
        worst = max(worst, io_code)
    failed = any(d.is_error for d in all_diags) or (args.werror and any(d.severity == "warning" for d in all_diags))
    if args.format == "json":
        print_json({"files": len(args.files), "diagnostics": [diagnostic_data(d) for d in all_diags]})
    print(summary(all_diags, len(args.files)), file=sys.stderr)
    return worst if worst else (EXIT_ERRORS if failed else EXIT_OK)


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("check", help="parse and verify files; print diagnostics")
    c.add_argument("files", nargs="+", metavar="FILE")
    c.add_argument("--werror", action="store_true", help="treat warnings as errors")
    add_format_option(c)
    c.set_defaults(func=run)
