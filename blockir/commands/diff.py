"""`blockir diff A B [--block NAME] [--block-b NAME]`: compare blocks as graphs.

Exit 0 when every compared pair is identical, 1 when one differs, 2 on a
usage or I/O problem (as diff(1) does).
"""
from __future__ import annotations

import argparse
import sys

from blockir.analyses.diff import diff_blocks, format_diff
from blockir.cli import EXIT_ERRORS, EXIT_OK, EXIT_USAGE, emit, load_file
from blockir.ir.program import Block, Program


def _load(path: str) -> Program | int:
    sources: dict[str, str] = {}
    program, diags, io_code = load_file(path, sources)
    if io_code or program is None or any(d.is_error for d in diags):
        emit(diags, sources)
        return io_code or EXIT_USAGE
    return program


def _pairs(a: Program, b: Program, name_a: str | None, name_b: str | None) -> list[tuple[Block, Block]] | str:
    if name_a is not None:
        name_b = name_b or name_a
        for program, name in ((a, name_a), (b, name_b)):
            if name not in program.block_map:
                return f"no block named '{name}' in {program.filename} (blocks: {', '.join(program.block_map)})"
        return [(a.block(name_a), b.block(name_b))]
    common = [n for n in a.block_map if n in b.block_map]
    if common:
        return [(a.block(n), b.block(n)) for n in common]
    if len(a.blocks) == 1 and len(b.blocks) == 1:
        return [(a.blocks[0], b.blocks[0])]
    return "the files share no block name; choose with --block NAME [--block-b NAME]"


def run(args: argparse.Namespace) -> int:
    a, b = _load(args.a), _load(args.b)
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    pairs = _pairs(a, b, args.block, args.block_b)
    if isinstance(pairs, str):
        print(f"blockir: {pairs}", file=sys.stderr)
        return EXIT_USAGE
    diffs = [diff_blocks(a, x, b, y) for x, y in pairs]
    print("\n\n".join(format_diff(d, args.a, args.b) for d in diffs))
    return EXIT_OK if all(d.identical for d in diffs) else EXIT_ERRORS


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("diff", help="compare two blocks as graphs: identical, or where they first differ")
    s.add_argument("a", metavar="A")
    s.add_argument("b", metavar="B")
    s.add_argument("--block", help="the block to compare (default: every block name both files define)")
    s.add_argument("--block-b", help="its name in B, when it differs")
    s.set_defaults(func=run)
