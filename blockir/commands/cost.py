"""`blockir cost FILE [--block NAME] --dims B=8,S=2048,D=4096 [--dtype bf16] [--format json]`: the ledger."""
from __future__ import annotations

import argparse
import json
import sys

from blockir.cli import EXIT_OK, EXIT_USAGE, with_program
from blockir.commands.run import default_block, parse_dims
from blockir.ir.program import Block, Program
from blockir.ir.types import DType


def run(args: argparse.Namespace) -> int:
    def show(program: Program, blocks: list[Block]) -> int:
        from blockir.reports.cost import CostError, format_ledger, ledger, ledger_data
        block = blocks[0] if args.block else default_block(program)
        try:
            led = ledger(program, block.name, parse_dims(args.dims), DType(args.dtype))
        except (ValueError, CostError) as exc:
            print(f"blockir: {exc}", file=sys.stderr)
            return EXIT_USAGE
        text = json.dumps(ledger_data(led), indent=2) + "\n" if args.format == "json" else format_ledger(led)
        print(text, end="")
        return EXIT_OK
    return with_program(args, show)


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("cost", help="residual elements, adds, norm parameters, row reductions and bytes moved",
                       description="The residual-update ledger of a block or model at concrete sizes: residual "
                                   "elements, residual adds, norm parameters, row reductions, bytes the wrapper "
                                   "ops move (unfused and fused) and bytes saved for backward in training. Branch "
                                   "internals (attention, MLP) are not counted.")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--block", help="block or model (default: the last model in the file)")
    s.add_argument("--dims", help="sizes, e.g. B=8,S=2048,D=4096 (declared sizes fill the rest)")
    s.add_argument("--dtype", choices=[d.value for d in DType], default="bf16",
                   help="dtype of every value whose type leaves it open (default: bf16)")
    s.add_argument("--format", choices=("table", "json"), default="table")
    s.set_defaults(func=run)
