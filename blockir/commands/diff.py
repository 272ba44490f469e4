"""`blockir diff A B [--block NAME] [--block-b NAME] [--format json]`: compare blocks by what they compute.

``--block`` picks the block of A (the usual default: the last model, else the only block) and
``--block-b`` its counterpart in B (default: the block of the same name, else B's default). The
blocks both call under the same name are compared too. Exit 0 when every compared pair is
identical, 1 when one differs, 2 on trouble (as diff(1) does): a usage or I/O problem, or a
file with errors, whose diagnostics are printed.
"""
from __future__ import annotations

import argparse
from typing import Any

from blockir.cli import (EXIT_ERRORS, EXIT_OK, EXIT_USAGE, add_block_option, add_format_option, emit, load_program,
                         print_json, target_block, with_callees)
from blockir.diagnostics import BlockError
from blockir.ir.program import Block, Program


def _pairs(a: Program, b: Program, name_a: str | None, name_b: str | None) -> list[tuple[Block, Block]]:
    root_a = target_block(a, name_a)
    if name_b is None and root_a.name in b.block_map:
        name_b = root_a.name
    root_b = target_block(b, name_b)
    called_b = {blk.name: blk for blk in with_callees(b, root_b) if blk is not root_b}
    pairs = [(blk, called_b[blk.name]) for blk in with_callees(a, root_a) if blk is not root_a and blk.name in called_b]
    return pairs + [(root_a, root_b)]


def _op(op: Any) -> dict[str, str] | None:
    from blockir.ir.printer import format_op
    return {"location": str(op.span), "op": format_op(op)} if op is not None else None


def run(args: argparse.Namespace) -> int:
    from blockir.analyses.diff import diff_blocks, format_diff
    try:
        a, b = load_program(args.a), load_program(args.b)
    except BlockError as exc:
        emit(exc.diagnostics, exc.sources)
        return EXIT_USAGE
    diffs = [diff_blocks(a, x, b, y) for x, y in _pairs(a, b, args.block, args.block_b)]
    if args.format == "json":
        print_json([{"a": d.a.name, "b": d.b.name, "identical": d.identical, "category": d.category,
                     "same_function": d.same_function, "verdict": d.verdict,
                     "signature_changed": d.signature_changed, "first_a": _op(d.first_a), "first_b": _op(d.first_b),
                     "same_keys": d.same_keys, "key_changes": list(d.key_changes)} for d in diffs])
    else:
        print("\n\n".join(format_diff(d, args.a, args.b) for d in diffs))
    return EXIT_OK if all(d.identical for d in diffs) else EXIT_ERRORS


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("diff", help="compare two blocks as graphs: identical, or where they first differ")
    s.add_argument("a", metavar="A")
    s.add_argument("b", metavar="B")
    add_block_option(s)
    s.add_argument("--block-b", metavar="NAME", help="the block of B (default: the block of the same name)")
    add_format_option(s)
    s.set_defaults(func=run)
