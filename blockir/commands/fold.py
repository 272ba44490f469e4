"""`blockir fold FILE [--block NAME] [--mode train|infer] [--apply]`: what may fold where, and why not;
with --apply, the folded program and the log of folds fired and kept."""
from __future__ import annotations

import argparse

from blockir.cli import EXIT_OK, with_program
from blockir.ir.printer import format_program
from blockir.ir.program import Block, Program
from blockir.analyses.fold_legality import fold_report, format_report
from blockir.rewrites.fold import apply_folds, format_log


def _apply(program: Program, blocks: list[Block], mode: str) -> str:
    logs = []
    for b in blocks:
        result = apply_folds(program, b.name, mode=mode)
        program = result.program
        logs.append(format_log(b.name, mode, result.report))
    return format_program(program) + "\n" + "\n\n".join(logs)


def run(args: argparse.Namespace) -> int:
    def show(program: Program, blocks: list[Block]) -> int:
        if args.apply:
            print(_apply(program, blocks, args.mode))
        else:
            print("\n\n".join(format_report(b, args.mode, fold_report(b, args.mode)) for b in blocks))
        return EXIT_OK
    return with_program(args, show)


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("fold", help="which scales, norm affines and dropouts may fold, where, or why not")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--block", help="only this block")
    s.add_argument("--mode", choices=("train", "infer"), default="infer", help="default: infer")
    s.add_argument("--apply", action="store_true",
                   help="fold every legal site; print the folded program and the log of folds fired and kept")
    s.set_defaults(func=run)
