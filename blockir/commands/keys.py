"""`blockir keys FILE [--block NAME] [--dims D=64,…]`: the parameter keys and shapes a block owns."""
from __future__ import annotations

import argparse
import sys

from blockir.analyses.keys import param_keys
from blockir.cli import EXIT_OK, EXIT_USAGE, with_program
from blockir.ir.program import Block, Program


def parse_dims(text: str | None) -> dict[str, int] | str:
    """'D=64,F=128' → {'D': 64, 'F': 128}, or an error message."""
    dims: dict[str, int] = {}
    for item in filter(None, (text or "").split(",")):
        name, _, size = item.partition("=")
        if not name.strip() or not size.strip().isdigit() or int(size) <= 0:
            return f"--dims takes NAME=SIZE pairs with positive sizes, got '{item}'"
        dims[name.strip()] = int(size)
    return dims


def run(args: argparse.Namespace) -> int:
    dims = parse_dims(args.dims)
    if isinstance(dims, str):
        print(f"blockir: {dims}", file=sys.stderr)
        return EXIT_USAGE

    def show(program: Program, blocks: list[Block]) -> int:
        tables = [param_keys(program, b.name, dims) for b in blocks]  # a size error is a located diagnostic
        print("\n\n".join(f"{b.kind} {t.block}:\n" + "\n".join("  " + line for line in str(t).splitlines())
                          for b, t in zip(blocks, tables)))
        return EXIT_OK
    return with_program(args, show)


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("keys", help="list the parameter keys and shapes a block or model owns")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--block", help="only this block (default: every block)")
    s.add_argument("--dims", metavar="D=64,…", help="sizes for dims the file leaves open")
    s.set_defaults(func=run)
