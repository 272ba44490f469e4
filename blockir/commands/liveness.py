"""`blockir liveness FILE [--block NAME] [--mode train|infer]`: in-place decisions and the buffer plan."""
from __future__ import annotations

import argparse

from blockir.cli import EXIT_OK, with_program
from blockir.ir.program import Block, Program
from blockir.analyses.liveness import MODES, format_plan, plan


def run(args: argparse.Namespace) -> int:
    def show(program: Program, blocks: list[Block]) -> int:
        print("\n\n".join(format_plan(b, plan(b, args.mode)) for b in blocks))
        return EXIT_OK
    return with_program(args, show)


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("liveness", help="which residual adds may write in place, and the buffer plan",
                       description="For every add: whether its result may overwrite the shortcut's storage, or which "
                                   "later read or saved value blocks it; then which values share a buffer and the "
                                   "peak number of live state-sized tensors.")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--block", help="only this block")
    s.add_argument("--mode", choices=MODES, default="infer",
                   help="train: ops keep what backward needs; infer: nothing is kept (default)")
    s.set_defaults(func=run)
