"""Where a traced node comes from in the user's Python: ``FILE.py:LINE:COL`` from its stack trace."""
from __future__ import annotations

import inspect
import io
import linecache
import os
import re
import tokenize
from typing import Any

import torch.fx as fx

from blockir.diagnostics import Span

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
# frames of the tracing machinery, never the user's
_SKIP = (os.path.dirname(fx.__file__).rsplit(os.sep, 1)[0], os.path.dirname(__file__))


def frames(node: fx.Node) -> list[tuple[str, int, str]]:
    """(file, line, function) of each frame of the node's stack, outermost first, user frames only."""
    text = node.meta.get("stack_trace") or node.stack_trace or ""
    out = []
    for m in _FRAME.finditer(text):
        path = m.group(1)
        if path.startswith("<") or path.startswith(_SKIP):
            continue
        out.append((path, int(m.group(2)), m.group(3)))
    return out


def _methods(cls: type) -> set[str]:
    return {name for klass in cls.__mro__ if klass is not object for name in vars(klass)}


def _code(text: str) -> str:
    """The line without its trailing comment."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text.strip() + "\n").readline):
            if tok.type == tokenize.COMMENT:
                return text[:len(text) - len(text.lstrip()) + tok.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):
        pass
    return text


def _span(path: str, line: int, token: str | None = None) -> Span:
    text = _code(linecache.getline(path, line).rstrip("\n"))
    start = len(text) - len(text.lstrip())
    if token:
        at = text.find(token, start)
        if at >= 0:
            return Span(path, line, at + 1, at + 1 + len(token))
    return Span(path, line, start + 1, len(text.rstrip()) + 1)


def detail_span(node: fx.Node, token: str | None = None) -> Span | None:
    """The innermost user frame of the node: the line that computed it."""
    fs = frames(node)
    return _span(fs[-1][0], fs[-1][1], token) if fs else None


def site_span(node: fx.Node, module: Any, token: str | None = None) -> Span | None:
    """The innermost frame inside a method of ``module``'s class: where the lifted block did it."""
    try:
        files = {inspect.getsourcefile(k) for k in type(module).__mro__ if k is not object}
    except TypeError:
        files = set()
    names = _methods(type(module))
    for path, line, fn in reversed(frames(node)):
        if path in files and fn in names:
            return _span(path, line, token)
    return detail_span(node, token)


def source_text(path: str) -> str | None:
    lines = linecache.getlines(path)
    return "".join(lines) if lines else None
