"""`blockir show FILE`: the program as IR text, Graphviz dot, JSON, or its block manifest.

Without ``--block`` the whole file is shown; with it, that block (IR text: with the blocks it
calls and the file's dims and constants, so the output is a valid ``.block`` file).
``--format manifest`` prints the manifest of every block (topology, branch order, norms, scales,
dropout owners, initialisation, padding policy, final and embedding norms, shortcut weights, recipe
contract, dtypes) and the training, runtime and tensor sections, as YAML, or as JSON with
``--manifest-format json`` (docs/manifest.md lists every field).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace

from blockir.cli import EXIT_OK, load_program, target_block, with_callees
from blockir.ir.program import Block, Program


def _fused_block(block: Block) -> str:
    """One block after fusion, as parseable text: each fused op is a comment above the ops it replaces."""
    from blockir.ir.printer import format_block, format_op
    from blockir.ir.traits import BlockInput
    from blockir.passes.fuse import fuse_block
    _, chains = fuse_block(block)
    at_add = {}
    for c in chains:
        members = {id(o) for o in c.absorbed}
        at_add[id(c.add)] = (tuple(o for o in block.ops if id(o) in members), c.fused)
    taken = {id(o) for group, _ in at_add.values() for o in group}
    ops, comments = [], {}
    for op in block.ops:
        if id(op) in at_add:
            # the absorbed ops move to the add, in their order: their operands are defined before it
            group, fused = at_add[id(op)]
            comments[len(ops)] = f"# fused ({len(group)} ops below): {format_op(fused)}"
            ops += group
        elif id(op) not in taken:
            ops.append(op)
    lines = format_block(replace(block, ops=tuple(ops))).split("\n")
    # the printer ends a block with one line per op (inputs are in the header), then "}"
    printed = [i for i, op in enumerate(ops) if not op.has(BlockInput)]
    first = len(lines) - 1 - len(printed)
    for k in sorted(comments, reverse=True):
        row = first + printed.index(k)
        indent = lines[row][: len(lines[row]) - len(lines[row].lstrip())]
        lines.insert(row, indent + comments[k])
    return "\n".join(lines)


def _fused_ir(shown: Program) -> str:
    from blockir.ir.printer import format_program
    head = format_program(replace(shown, blocks=())).rstrip("\n")
    return "\n\n".join(([head] if head else []) + [_fused_block(b) for b in shown.blocks]) + "\n"


def _render(args: argparse.Namespace, program: Program, blocks: list[Block], whole: bool) -> str:
    if args.format == "ir":
        from blockir.ir.printer import format_program
        shown = program if whole else replace(program, blocks=tuple(blocks))
        if args.fuse:
            return _fused_ir(shown)
        return format_program(shown)
    if args.fuse:
        from blockir.passes.fuse import FUSE
        from blockir.passes.manager import run_passes
        program = run_passes(program, [FUSE])
        blocks = [program.block(b.name) for b in blocks]
    if args.format == "manifest":
        from blockir.analyses.manifest import program_manifest, to_yaml
        from blockir.reports.run_manifest import run_manifest
        data = program_manifest(program, None if whole else blocks) | \
            run_manifest(program, "fused" if args.fuse else "fx")
        return to_yaml(data) if args.manifest_format == "yaml" else json.dumps(data, indent=2) + "\n"
    if args.format == "dot":
        from blockir.reports.dot import blocks_to_dot
        return blocks_to_dot(blocks)
    from blockir.ir.serialize import program_to_data, to_data
    return json.dumps(program_to_data(program) if whole else to_data(blocks[-1]), indent=2) + "\n"


def run(args: argparse.Namespace) -> int:
    program = load_program(args.file)
    if args.block is None:
        blocks = list(program.blocks)
    else:
        target = target_block(program, args.block)
        # IR text and dot draw the block with what it calls; JSON and the manifest describe the block itself
        blocks = with_callees(program, target) if args.format in ("ir", "dot") else [target]
    print(_render(args, program, blocks, args.block is None), end="")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("show", help="print a program as IR, Graphviz dot, JSON or its block manifest")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--block", metavar="NAME", help="only this block (and, for ir and dot, the blocks it calls); "
                                                  "default: the whole file")
    s.add_argument("--format", choices=("ir", "dot", "json", "manifest"), default="ir")
    s.add_argument("--manifest-format", choices=("yaml", "json"), default="yaml",
                   help="how --format manifest is written (default: yaml)")
    s.add_argument("--fuse", action="store_true",
                   help="show the program after the add+norm fusion pass (ir: each fused op is a comment above "
                        "the ops it replaces, so the output still parses)")
    s.set_defaults(func=run)
