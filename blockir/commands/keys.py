"""`blockir keys FILE [--block NAME] [--dims D=64,…] [--format json]`: the checkpoint keys a block owns.

Each key with its shape, its role (parameter, buffer, counter), its layout (``out,in``, GPT-2's
``in,out``, …, with a fused projection's row order) and, for a tied head, the key it shares.
"""
from __future__ import annotations

import argparse

from blockir.cli import (EXIT_OK, add_block_option, add_dims_option, add_format_option, print_json,
                         with_program)
from blockir.ir.program import Block, Program


def run(args: argparse.Namespace) -> int:
    def show(program: Program, block: Block) -> int:
        from blockir.analyses.keys import param_keys
        table = param_keys(program, block.name, args.dims)  # a size error is a located diagnostic
        if args.format == "json":
            print_json({"block": block.name, "kind": block.kind,
                        "keys": [{"name": k.name, "shape": list(k.shape), "owner": k.owner, "family": k.family,
                                  "role": k.role, "layout": k.layout,
                                  **({"fused": k.fused} if k.fused else {}),
                                  **({"alias_of": k.alias_of} if k.alias_of else {})}
                                 for k in table.keys],
                        "aliases": table.aliases,
                        "unknown": list(table.unknown)})
        else:
            print(f"{block.kind} {table.block}:\n" + "\n".join("  " + line for line in str(table).splitlines()))
        return EXIT_OK
    return with_program(args, show)


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("keys", help="list the parameter keys and shapes a block or model owns")
    s.add_argument("file", metavar="FILE")
    add_block_option(s)
    add_dims_option(s, "D=64,F=128")
    add_format_option(s)
    s.set_defaults(func=run)
