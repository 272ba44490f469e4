"""The `blockir` command. Bad input becomes diagnostics and an exit code, never a traceback."""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import Callable, Sequence

from blockir import __version__, commands
from blockir.api import parse, read_source, verify
from blockir.diagnostics import BlockError, Diagnostic, render
from blockir.ir.program import Block, Program

EXIT_OK, EXIT_ERRORS, EXIT_USAGE = 0, 1, 2


def emit(diags: Sequence[Diagnostic], sources: dict[str, str]) -> None:
    for d in diags:
        print(render(d, sources), file=sys.stderr)


def load_file(path: str, sources: dict[str, str]) -> tuple[Program | None, list[Diagnostic], int]:
    """Parse and verify one file. Returns (program, diagnostics, exit code for an I/O failure)."""
    try:
        text = read_source(path)
    except BlockError as exc:
        # an unreadable file is a usage problem; undecodable content is a bad input
        unreadable = any(d.code == "E0006" for d in exc.diagnostics)
        return None, exc.diagnostics, EXIT_USAGE if unreadable else EXIT_OK
    sources[path] = text
    try:
        program = parse(text, path)
    except BlockError as exc:
        return None, exc.diagnostics, EXIT_OK
    return program, verify(program), EXIT_OK


def summary(diags: Sequence[Diagnostic], files: int) -> str:
    errors = sum(d.severity == "error" for d in diags)
    warnings = sum(d.severity == "warning" for d in diags)
    return f"{files} file{'s' if files != 1 else ''} checked: {errors} error{'s' if errors != 1 else ''}, " \
           f"{warnings} warning{'s' if warnings != 1 else ''}"


def select_blocks(program: Program, name: str | None) -> list[Block] | str:
    """The block named by --block, or all; an error message when the name is unknown."""
    if name is None:
        return list(program.blocks)
    if name not in program.block_map:
        known = ", ".join(program.block_map) or "none"
        return f"no block named '{name}' (blocks: {known})"
    return [program.block(name)]


def with_program(args: argparse.Namespace, fn: Callable[[Program, list[Block]], int]) -> int:
    """Load args.file; on success call fn(program, selected blocks), else print diagnostics."""
    sources: dict[str, str] = {}
    program, diags, io_code = load_file(args.file, sources)
    if io_code:
        emit(diags, sources)
        return io_code
    if program is None or any(d.is_error for d in diags):
        emit(diags, sources)
        return EXIT_ERRORS
    blocks = select_blocks(program, getattr(args, "block", None))
    if isinstance(blocks, str):
        print(f"blockir: {blocks}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return fn(program, blocks)
    except BlockError as exc:  # sizes, names and bindings that only a command's work can check
        emit(exc.diagnostics, sources)
        return EXIT_ERRORS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="blockir", description="Compile and check Transformer block topologies.")
    p.add_argument("--version", action="version", version=f"blockir {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # every module in blockir.commands contributes one subcommand through register()
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"blockir.commands.{info.name}").register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        return EXIT_OK
