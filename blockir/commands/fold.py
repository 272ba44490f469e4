"""`blockir fold FILE [--block NAME] [--mode train|infer] [--apply] [--format json]`: what may fold where, and
why not, in a block and every block it calls; with --apply, the folded program on stdout and the log of
folds fired and kept on stderr."""
from __future__ import annotations

import argparse
from typing import Any

from blockir.cli import EXIT_OK, add_block_option, add_format_option, log, print_json, with_callees, with_program
from blockir.ir.program import Block, Program


def _site(site: Any) -> dict[str, Any]:
    return {"location": str(site.span), "kind": site.kind, "name": site.name, "legal": site.legal,
            "action": site.action, "into": list(site.into), "code": site.code, "reason": site.reason}


def _apply(program: Program, blocks: list[Block], mode: str, fmt: str) -> int:
    from blockir.ir.printer import format_program
    from blockir.passes.fold import fold_pass, format_log
    from blockir.passes.manager import run_pass
    logs, events = [], []
    for b in blocks:
        result = run_pass(program, fold_pass(b.name, mode))
        program = result.program
        logs.append(format_log(b.name, mode, result.detail.report))
        events += [{**_site(e.site), "block": b.name, "fired": e.fired, "rule": e.rule,
                    "kept_code": e.code, "kept_reason": e.reason} for e in result.detail.report]
    if fmt == "json":
        print_json({"mode": mode, "program": format_program(program), "log": events})
    else:
        log("\n\n".join(logs))
        print(format_program(program), end="")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    def show(program: Program, target: Block) -> int:
        blocks = with_callees(program, target)
        if args.apply:
            return _apply(program, blocks, args.mode, args.format)
        from blockir.analyses.fold_legality import fold_report, format_report
        if args.format == "json":
            print_json([{"block": b.name, "kind": b.kind, "mode": args.mode,
                         "sites": [_site(s) for s in fold_report(b, args.mode)]} for b in blocks])
        else:
            print("\n\n".join(format_report(b, args.mode, fold_report(b, args.mode)) for b in blocks))
        return EXIT_OK
    return with_program(args, show)


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("fold", help="which scales, norm affines and dropouts may fold, where, or why not")
    s.add_argument("file", metavar="FILE")
    add_block_option(s)
    s.add_argument("--mode", choices=("train", "infer"), default="infer", help="default: infer")
    s.add_argument("--apply", action="store_true",
                   help="fold every legal site of the block and the blocks it calls; print the folded program "
                        "(stdout) and the log of folds fired and kept (stderr)")
    add_format_option(s)
    s.set_defaults(func=run)
