"""The `blockir` command. Bad input becomes diagnostics and an exit code, never a traceback."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Sequence

from blockir import __version__
from blockir.api import parse, read_source, verify
from blockir.diagnostics import BlockError, Diagnostic, render
from blockir.ir.program import Block, Program

EXIT_OK, EXIT_ERRORS, EXIT_USAGE = 0, 1, 2


def _emit(diags: Sequence[Diagnostic], sources: dict[str, str]) -> None:
    for d in diags:
        print(render(d, sources), file=sys.stderr)


def _load(path: str, sources: dict[str, str]) -> tuple[Program | None, list[Diagnostic], int]:
    """Parse and verify one file. Returns (program, diagnostics, exit code for an I/O failure)."""
    try:
        text = read_source(path)
    except BlockError as exc:
        return None, exc.diagnostics, EXIT_USAGE
    sources[path] = text
    try:
        program = parse(text, path)
    except BlockError as exc:
        return None, exc.diagnostics, EXIT_OK
    return program, verify(program), EXIT_OK


def _summary(diags: Sequence[Diagnostic], files: int) -> str:
    errors = sum(d.severity == "error" for d in diags)
    warnings = sum(d.severity == "warning" for d in diags)
    return f"{files} file{'s' if files != 1 else ''} checked: {errors} error{'s' if errors != 1 else ''}, " \
           f"{warnings} warning{'s' if warnings != 1 else ''}"


def cmd_check(args: argparse.Namespace) -> int:
    sources: dict[str, str] = {}
    all_diags: list[Diagnostic] = []
    worst = EXIT_OK
    for path in args.files:
        _, diags, io_code = _load(path, sources)
        _emit(diags, sources)
        all_diags += diags
        worst = max(worst, io_code)
    failed = any(d.is_error for d in all_diags) or (args.werror and any(d.severity == "warning" for d in all_diags))
    print(_summary(all_diags, len(args.files)), file=sys.stderr)
    return worst if worst else (EXIT_ERRORS if failed else EXIT_OK)


def select_blocks(program: Program, name: str | None) -> list[Block] | str:
    """The block named by --block, or all; an error message when the name is unknown."""
    if name is None:
        return list(program.blocks)
    if name not in program.block_map:
        known = ", ".join(program.block_map) or "none"
        return f"no block named '{name}' (blocks: {known})"
    return [program.block(name)]


def with_program(args: argparse.Namespace, fn: Callable[[Program, list[Block]], int]) -> int:
    sources: dict[str, str] = {}
    program, diags, io_code = _load(args.file, sources)
    if io_code:
        _emit(diags, sources)
        return io_code
    errors = [d for d in diags if d.is_error]
    if program is None or errors:
        _emit(diags, sources)
        return EXIT_ERRORS
    blocks = select_blocks(program, getattr(args, "block", None))
    if isinstance(blocks, str):
        print(f"blockir: {blocks}", file=sys.stderr)
        return EXIT_USAGE
    return fn(program, blocks)


def cmd_show(args: argparse.Namespace) -> int:
    def show(program: Program, blocks: list[Block]) -> int:
        if args.format == "ir":
            from blockir.ir.printer import format_block, format_program
            print(format_program(program) if args.block is None else format_block(blocks[0]), end="" if args.block is None else "\n")
        elif args.format == "dot":
            from blockir.ir.dot import block_to_dot
            print("".join(block_to_dot(b) for b in blocks), end="")
        else:
            from blockir.ir.serialize import program_to_data, to_data
            data = program_to_data(program) if args.block is None else to_data(blocks[0])
            print(json.dumps(data, indent=2))
        return EXIT_OK
    return with_program(args, show)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="blockir", description="Compile and check Transformer block topologies.")
    p.add_argument("--version", action="version", version=f"blockir {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser("check", help="parse and verify files; print diagnostics")
    c.add_argument("files", nargs="+", metavar="FILE")
    c.add_argument("--werror", action="store_true", help="treat warnings as errors")
    c.set_defaults(func=cmd_check)

    s = sub.add_parser("show", help="print a program as IR, Graphviz dot or JSON")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--block", help="only this block")
    s.add_argument("--format", choices=("ir", "dot", "json"), default="ir")
    s.set_defaults(func=cmd_show)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        return EXIT_OK
