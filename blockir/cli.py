"""The `blockir` command. Bad input becomes diagnostics and an exit code, never a traceback.

Every subcommand follows the same conventions, implemented once here:

- ``--block NAME`` names the block or model a command works on; without it, the last ``model``
  of the file, else its only block; a file with several blocks and no model is a usage error
  that lists them (:func:`target_block`).
- ``--dims NAME=INT,…`` is parsed by :func:`parse_dims`; a malformed entry is a usage error that
  names it. Whether a name is a known dim and a size is positive is decided by the layer the
  sizes go to, which reports it with the list of dims.
- ``--format json`` prints the report as JSON; every location is ``FILE:LINE:COL``.
- The report goes to stdout, logs and progress to stderr, so a command's output can be
  redirected into a file and used (``blockir fold --apply f.block > g.block``).
"""
from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import re
import sys
from typing import Any, Callable, Sequence

from blockir import __version__, commands
from blockir.api import parse, read_source, verify
from blockir.diagnostics import BlockError, Diagnostic, Span, render
from blockir.ir.decls import InstanceDecl
from blockir.ir.program import Block, Program

EXIT_OK, EXIT_ERRORS, EXIT_USAGE = 0, 1, 2
_DIM = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([+-]?[0-9]+)\s*")


class UsageError(Exception):
    """A request the command cannot serve as asked: printed as ``blockir: MESSAGE``, exit 2."""


def log(message: str) -> None:
    """Progress and side remarks: stderr, so that stdout holds only the report."""
    print(message, file=sys.stderr, flush=True)


def emit(diags: Sequence[Diagnostic], sources: dict[str, str]) -> None:
    for d in diags:
        print(render(d, sources), file=sys.stderr)


def where(span: Span) -> str:
    """A location as every report prints it."""
    return f"{span.filename}:{span.line}:{span.column}"


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def parse_dims(text: str) -> dict[str, int]:
    """``'B=2,S=16'`` → ``{'B': 2, 'S': 16}``: the one parser of ``--dims`` (argparse ``type=``)."""
    out: dict[str, int] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        m = _DIM.fullmatch(item)
        if m is None:
            name = item.partition("=")[0].strip()
            what = f"dim '{name}'" if "=" in item and name else f"'{item.strip()}'"
            raise argparse.ArgumentTypeError(f"{what}: expected NAME=INTEGER, got '{item.strip()}'")
        out[m.group(1)] = int(m.group(2))
    return out


def add_block_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--block", metavar="NAME",
                   help="the block or model to work on (default: the last model, else the only block)")


def add_dims_option(p: argparse.ArgumentParser, example: str = "B=2,S=16,D=64") -> None:
    p.add_argument("--dims", type=parse_dims, default={}, metavar="NAME=INT,…",
                   help=f"sizes for dims, e.g. {example} (declared sizes fill the rest)")


def add_format_option(p: argparse.ArgumentParser, *others: str) -> None:
    choices = (*others, "json") if others else ("text", "json")
    p.add_argument("--format", choices=choices, default=choices[0], help=f"default: {choices[0]}")


def _names(program: Program) -> str:
    return ", ".join(program.block_map) or "none"


def target_block(program: Program, name: str | None) -> Block:
    """The block ``--block`` names, else the last model, else the only block."""
    if name is not None:
        if name not in program.block_map:
            raise UsageError(f"no block named '{name}' (blocks: {_names(program)})")
        return program.block(name)
    models = [b for b in program.blocks if b.kind == "model"]
    if models:
        return models[-1]
    if len(program.blocks) == 1:
        return program.blocks[0]
    raise UsageError(f"{program.filename} defines several blocks and no model; choose one with --block "
                     f"(blocks: {_names(program)})")


def with_callees(program: Program, block: Block) -> list[Block]:
    """``block`` and every block it calls, directly or through others, in file order."""
    seen, todo = {block.name}, [block]
    while todo:
        for d in todo.pop().decls:
            if isinstance(d, InstanceDecl) and d.block not in seen and d.block in program.block_map:
                seen.add(d.block)
                todo.append(program.block(d.block))
    return [b for b in program.blocks if b.name in seen]


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


def load_program(path: str) -> Program:
    """A verified program; a file with errors raises BlockError, an unreadable one UsageError."""
    sources: dict[str, str] = {}
    program, diags, io_code = load_file(path, sources)
    if io_code:
        raise UsageError(diags[0].message if diags else f"cannot read {path}")
    if program is None or any(d.is_error for d in diags):
        raise BlockError(list(diags), sources)
    return program


def with_program(args: argparse.Namespace, fn: Callable[[Program, Block], int]) -> int:
    """Load ``args.file`` and call ``fn(program, target block)``."""
    program = load_program(args.file)
    return fn(program, target_block(program, getattr(args, "block", None)))


def user_class(path: str, cls_name: str, module_prefix: str) -> type:
    """The ``nn.Module`` class ``cls_name`` of the user's Python file ``path``, imported with its folder on the
    import path (its own imports of its neighbours); a file that fails to import is E0910 at the file."""
    import importlib.util
    from pathlib import Path

    from torch import nn

    from blockir.diagnostics import error
    if not Path(path).is_file():
        raise UsageError(f"cannot read {path}")
    folder = str(Path(path).resolve().parent)
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(f"{module_prefix}_{Path(path).stem}", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except Exception as exc:  # the user's file
            raise BlockError([error("E0910", f"importing {path} fails: {type(exc).__name__}: {exc}",
                                    Span(path, 1, 1), hint="the file must import on its own")]) from None
    finally:
        sys.path.remove(folder)
    cls = getattr(mod, cls_name, None)
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise UsageError(f"{path} defines no nn.Module class '{cls_name}'")
    return cls


def _command_modules(argv: Sequence[str]) -> list[str]:
    """The modules of ``blockir.commands`` whose subcommand this command line can run: the one it names
    (a module is named after its command, ``import_`` for ``import``), else all of them (for the command
    list in ``--help`` and in the error for an unknown command)."""
    names = sorted(info.name for info in pkgutil.iter_modules(commands.__path__))
    first = next((a for a in argv if not a.startswith("-")), None)  # the top level has no valued options
    named = [m for m in names if first is not None and m.rstrip("_") == first]
    return named or names


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="blockir", description="Compile and check Transformer block topologies.")
    p.add_argument("--version", action="version", version=f"blockir {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # every module in blockir.commands contributes one subcommand through register(); the modules
    # import what their command needs only when it runs, and only the named command's module is
    # imported at all, so that building this parser stays cheap
    for name in _command_modules(argv):
        importlib.import_module(f"blockir.commands.{name}").register(sub)
    return p


def add_force_option(p: argparse.ArgumentParser, option: str, kind: str) -> None:
    p.add_argument("--force", action="store_true", help=f"replace a blockir {kind} already at {option} (whole, "
                   "never a folder holding anything else)")


def interrupted(args: argparse.Namespace, signum: int) -> int:
    """After SIGINT or SIGTERM: one line naming the signal and what the command's destination holds now."""
    import signal

    from blockir.lifecycle.destination import describe
    option = getattr(args, "writes", None)
    kept = describe(getattr(args, option.lstrip("-").replace("-", "_")), option) if option else "nothing was written"
    log(f"blockir: interrupted by {signal.Signals(signum).name}; {kept}")
    return 128 + signum


def main(argv: Sequence[str] | None = None) -> int:
    from blockir.lifecycle.atomic import Interrupted, handle_signals
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    with handle_signals():
        try:
            return args.func(args)
        except UsageError as exc:
            print(f"blockir: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except BlockError as exc:
            emit(exc.diagnostics, exc.sources)
            return EXIT_ERRORS
        except BrokenPipeError:
            return EXIT_OK
        except Interrupted as exc:
            return interrupted(args, exc.signum)
        except KeyboardInterrupt:
            return interrupted(args, 2)
