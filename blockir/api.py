"""The public entry points: parse, load, verify."""
from __future__ import annotations

from functools import lru_cache
from os import PathLike
from pathlib import Path
from typing import Any

from blockir.analyses.cache import per_object
from blockir.collector import gc_paused
from blockir.diagnostics import BlockError, Diagnostic, Note, Span, argument_error, error, json_span, render
from blockir.frontend.builder import build
from blockir.frontend.parser import decode, parse_ast
from blockir.ir.program import Program
from blockir.signatures import public
from blockir.verifiers.registry import run_verifiers


@public("parse")
def parse(text: str, filename: str = "<string>") -> Program:
    """Parse and type one .block text (syntax, names, arguments, types).

    Raises BlockError carrying every diagnostic found; the exception's text is
    the rendered diagnostics with source lines.
    """
    if not isinstance(text, str):
        raise BlockError([argument_error("parse", "text", f"parse expects the program text as a str, got "
                                         f"{type(text).__name__}", "read a file with blockir.load(path)")])
    if not isinstance(filename, str):
        raise BlockError([argument_error("parse", "filename", f"filename must be a str, got {type(filename).__name__}")])
    try:
        return _built(text, filename)
    except BlockError as exc:
        raise BlockError(exc.diagnostics, {filename: text}) from None


# A program is immutable, so the same text under the same name is one program: ``compile(path)`` followed by
# ``parallelize(m, mesh, path)`` (or a run's repeated loads) parse and verify a file once.
@lru_cache(maxsize=32)
def _built(text: str, filename: str) -> Program:
    with gc_paused():
        return build(parse_ast(text, filename))


def read_source(path: str | Path) -> str:
    """Read a file as UTF-8, turning I/O and encoding problems into BlockError."""
    if not isinstance(path, (str, PathLike)):
        raise BlockError([argument_error("load", "path", f"expected a file path (str or os.PathLike), got "
                                         f"{type(path).__name__}", "parse text with blockir.parse(text)")])
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise BlockError([error("E0006", f"cannot read file: {exc.strerror or exc}", Span(str(path), 1, 1))]) from None
    return decode(data, str(path))


@public("verify")
def verify(program: Program) -> list[Diagnostic]:
    """Run every registered verifier; returns errors and warnings sorted by position."""
    if not isinstance(program, Program):
        raise BlockError([argument_error("verify", "program", f"verify expects a Program, got {type(program).__name__}",
                                         "parse text with blockir.parse(text), or read and verify a file with "
                                         "blockir.load(path)")])
    return list(_verified(program))


@per_object
def _verified(program: Program) -> tuple[Diagnostic, ...]:
    with gc_paused():
        return tuple(run_verifiers(program))


@public("load")
def load(path: str | Path) -> Program:
    """Read, parse and verify a file; raise BlockError if any verifier reports an error."""
    text = read_source(path)
    program = parse(text, str(path))
    diags = verify(program)
    if any(d.is_error for d in diags):
        raise BlockError(diags, {str(path): text})
    return program


def hf_block_text(config: Any, exact: bool = False, *, source: str | None = None) -> str:
    """The `.block` text for a transformers config (a dict, a JSON config's contents, or a config object), of the
    class its ``architectures`` names, checked: a file that fails its own check is never handed out (E0814).
    Every problem is a ``BlockError`` located at ``source: $.field`` (``source`` defaults to ``<hf config>``).

    ``exact`` writes ``impl=eager`` on every attention: HF's eager reference op for op.
    """
    from blockir.importers.hf.entry import import_text
    from blockir.importers.hf.text import SOURCE
    where = SOURCE if source is None else source
    text = import_text(config, exact, source=where)
    check_written(text, where)
    return text


def check_written(text: str, source: str) -> None:
    """Run the verifiers on a file an importer wrote for ``source``: a size past the language's bound is the
    config's (E0808); any other error is the importer's (E0814)."""
    name = f"{source} (imported)"
    try:
        found = [d for d in verify(parse(text, name)) if d.is_error]
    except BlockError as exc:
        found = exc.diagnostics
    oversized = [d for d in found if d.code == "E0702" and d.message.startswith("dim ")]
    if oversized:  # a size the writer derives (4 × the width …) past the language's bound: the config's sizes
        raise BlockError([error("E0808", f"a size derived from this config is too large: {oversized[0].message}",
                                json_span(source), hint="the language bounds every dim as it does in a .block file")])
    if found:
        first = found[0]
        raise BlockError([error("E0814", f"the file written for this config fails its own check: error[{first.code}] "
                                f"{first.message}", json_span(source), notes=[Note(render(first, {name: text}))],
                                hint="the importer writes a construct of this config wrongly; the file was not "
                                     "written")])
