"""`blockir show FILE`: the program as IR text, Graphviz dot or JSON."""
from __future__ import annotations

import argparse
import json

from blockir.cli import EXIT_OK, with_program
from blockir.ir.program import Block, Program



def _render(fmt: str, program: Program, blocks: list[Block], whole: bool) -> str:
    if fmt == "ir":
        from blockir.ir.printer import format_block, format_program
        return format_program(program) if whole else format_block(blocks[0]) + "\n"
    if fmt == "dot":
        from blockir.ir.dot import block_to_dot
        return "".join(block_to_dot(b) for b in blocks)
    from blockir.ir.serialize import program_to_data, to_data
    return json.dumps(program_to_data(program) if whole else to_data(blocks[0]), indent=2) + "\n"


def run(args: argparse.Namespace) -> int:
    def show(program: Program, blocks: list[Block]) -> int:
        print(_render(args.format, program, blocks, args.block is None), end="")
        return EXIT_OK
    return with_program(args, show)


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("show", help="print a program as IR, Graphviz dot or JSON")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--block", help="only this block")
    s.add_argument("--format", choices=("ir", "dot", "json"), default="ir")
    s.set_defaults(func=run)
