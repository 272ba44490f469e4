"""`blockir show FILE`: the program as IR text, Graphviz dot, JSON, or its block manifest.

``--format manifest`` prints the architecture manifest of every block (seed
0x01: topology, branch order, norms, scales, dropout, final norm, dtypes) as
YAML, or as JSON with ``--manifest-format json``.
"""
from __future__ import annotations

import argparse
import json

from blockir.cli import EXIT_OK, with_program
from blockir.ir.program import Block, Program


def _render(fmt: str, program: Program, blocks: list[Block], whole: bool, manifest_format: str = "yaml") -> str:
    if fmt == "ir":
        from blockir.ir.printer import format_block, format_program
        return format_program(program) if whole else format_block(blocks[0]) + "\n"
    if fmt == "manifest":
        from blockir.analyses.manifest import program_manifest, to_yaml
        data = program_manifest(program, None if whole else blocks)
        return to_yaml(data) if manifest_format == "yaml" else json.dumps(data, indent=2) + "\n"
    if fmt == "dot":
        from blockir.reports.dot import block_to_dot
        return "".join(block_to_dot(b) for b in blocks)
    from blockir.ir.serialize import program_to_data, to_data
    return json.dumps(program_to_data(program) if whole else to_data(blocks[0]), indent=2) + "\n"


def run(args: argparse.Namespace) -> int:
    def show(program: Program, blocks: list[Block]) -> int:
        if args.fuse:
            from blockir.rewrites.fuse import fuse_program
            program, _ = fuse_program(program)
            blocks = [program.block(b.name) for b in blocks]
        print(_render(args.format, program, blocks, args.block is None, args.manifest_format), end="")
        return EXIT_OK
    return with_program(args, show)


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("show", help="print a program as IR, Graphviz dot, JSON or its block manifest")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--block", help="only this block")
    s.add_argument("--format", choices=("ir", "dot", "json", "manifest"), default="ir")
    s.add_argument("--manifest-format", choices=("yaml", "json"), default="yaml",
                   help="how --format manifest is written (default: yaml)")
    s.add_argument("--fuse", action="store_true", help="show the IR after the add+norm fusion pass")
    s.set_defaults(func=run)
