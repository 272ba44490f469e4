"""Source spans, diagnostics and their rendering.

Every error a user can cause is a :class:`Diagnostic` with a stable code and a
span; rendering follows the ``FILE:LINE:COL: severity[CODE]: message`` form
followed by the source line and a caret underline.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable, Literal

Severity = Literal["error", "warning", "note"]


@dataclass(frozen=True)
class Span:
    """A 1-based source range; ``end_column`` is exclusive and on ``line``.

    Line 0 marks a place outside any file, such as an argument of a Python call
    (``blockir.compile(mode=…)``): it prints as its name alone.
    """

    filename: str
    line: int
    column: int
    end_column: int | None = None

    def __str__(self) -> str:
        if self.line < 1:
            return self.filename
        return f"{self.filename}:{self.line}:{self.column}"


UNKNOWN_SPAN = Span("<unknown>", 1, 1)


def json_span(filename: str, path: Iterable[str | int] = ()) -> Span:
    """A place in a JSON document as a JSONPath, ``config.json: $.rope_parameters.factor`` (line 0: no line)."""
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" if p.isidentifier() else f"[{json.dumps(p)}]"
                    for p in path)
    return Span(f"{filename}: ${where}", 0, 0)


@dataclass(frozen=True)
class Note:
    """A remark attached to a diagnostic, located when it points elsewhere."""

    message: str
    span: Span | None = None


@dataclass(frozen=True)
class Diagnostic:
    """One located error or warning, with its stable code and an optional hint."""

    code: str
    severity: Severity
    message: str
    span: Span
    notes: tuple[Note, ...] = ()
    hint: str | None = None

    @property
    def is_error(self) -> bool:
        return self.severity == "error"


def error(code: str, message: str, span: Span, *, hint: str | None = None, notes: Iterable[Note] = ()) -> Diagnostic:
    return Diagnostic(code, "error", message, span, tuple(notes), hint)


def warning(code: str, message: str, span: Span, *, hint: str | None = None, notes: Iterable[Note] = ()) -> Diagnostic:
    return Diagnostic(code, "warning", message, span, tuple(notes), hint)


def argument_error(function: str, argument: str, message: str, hint: str | None = None) -> Diagnostic:
    """A bad argument to a public function, located at the argument: ``blockir.compile(mode=…)``."""
    return error("E0722", message, Span(f"blockir.{function}({argument}=…)", 0, 0), hint=hint)


class BlockError(Exception):
    """Raised by the public API when a program has errors; carries every diagnostic."""

    def __init__(self, diagnostics: Iterable[Diagnostic], sources: dict[str, str] | None = None):
        self.diagnostics: list[Diagnostic] = list(diagnostics)
        self.sources = dict(sources or {})
        super().__init__(render_all(self.diagnostics, self.sources))


@dataclass
class SourceMap:
    """Filename → text, so rendering can quote the offending line."""

    texts: dict[str, str] = field(default_factory=dict)

    def line(self, filename: str, line: int) -> str | None:
        text = self.texts.get(filename)
        if text is None:
            return None
        lines = text.split("\n")  # spans count only \n as a line break
        return lines[line - 1] if 0 < line <= len(lines) else None


MAX_QUOTED = 200


def _caret(span: Span, source_line: str) -> list[str]:
    shown = source_line.expandtabs(1)[:MAX_QUOTED]
    start = max(span.column - 1, 0)
    end = span.end_column - 1 if span.end_column and span.end_column > span.column else start + 1
    end = min(max(end, start + 1), max(len(shown), start + 1))
    return [f"  {shown}", "  " + " " * start + "^" * (end - start)]


def render(diag: Diagnostic, sources: dict[str, str] | None = None) -> str:
    smap = SourceMap(dict(sources or {}))
    out = [f"{diag.span}: {diag.severity}[{diag.code}]: {diag.message}"]
    src = smap.line(diag.span.filename, diag.span.line)
    if src is not None:
        out += _caret(diag.span, src)
    for note in diag.notes:
        where = f"{note.span}: " if note.span else ""
        out.append(f"  = note: {where}{note.message}")
        if note.span is not None:
            nsrc = smap.line(note.span.filename, note.span.line)
            if nsrc is not None:
                out += ["  " + line for line in _caret(note.span, nsrc)]
    if diag.hint:
        out.append(f"  = hint: {diag.hint}")
    return "\n".join(out)


def render_all(diags: Iterable[Diagnostic], sources: dict[str, str] | None = None) -> str:
    return "\n".join(render(d, sources) for d in diags)


def sort_key(diag: Diagnostic) -> tuple[str, int, int, str]:
    return (diag.span.filename, diag.span.line, diag.span.column, diag.code)
