"""`blockir cost FILE [--block NAME] --dims B=8,S=2048,D=4096 [--dtype bf16] [--format json]`: the ledger."""
from __future__ import annotations

import argparse

from blockir.cli import (EXIT_OK, UsageError, add_block_option, add_dims_option, add_format_option, print_json,
                         with_program)
from blockir.ir.program import Block, Program
from blockir.ir.types import DType


def run(args: argparse.Namespace) -> int:
    def show(program: Program, block: Block) -> int:
        from blockir.reports.cost import CostError, format_ledger, ledger, ledger_data
        try:
            led = ledger(program, block.name, args.dims, DType(args.dtype))
        except (ValueError, CostError) as exc:
            raise UsageError(str(exc)) from None
        if args.format == "json":
            print_json(ledger_data(led))
        else:
            print(format_ledger(led), end="")
        return EXIT_OK
    return with_program(args, show)


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("cost", help="residual elements, adds, norm parameters, row reductions and bytes moved",
                       description="The residual-update ledger of a block or model at concrete sizes: residual "
                                   "elements, residual adds, norm parameters, row reductions, bytes the wrapper "
                                   "ops move (unfused and fused) and bytes saved for backward in training. Branch "
                                   "internals (attention, MLP) are not counted.")
    s.add_argument("file", metavar="FILE")
    add_block_option(s)
    add_dims_option(s, "B=8,S=2048,D=4096")
    s.add_argument("--dtype", choices=[d.value for d in DType], default="bf16",
                   help="dtype of every value whose type leaves it open (default: bf16)")
    add_format_option(s, "table")
    s.set_defaults(func=run)
