"""The IR as plain JSON-ready data (for `blockir show --format json`)."""
from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any

from blockir.diagnostics import Span
from blockir.ir.consts import Bin, Name, Neg, Num, format_expr
from blockir.ir.program import Program

_EXPR = (Num, Name, Bin, Neg)


def to_data(obj: Any) -> Any:
    if isinstance(obj, _EXPR):
        return format_expr(obj)
    if isinstance(obj, Span):
        return str(obj)
    if isinstance(obj, Enum):
        return obj.value
    if dataclasses.is_dataclass(obj):
        out: dict[str, Any] = {"class": type(obj).__name__}
        for f in dataclasses.fields(obj):
            out[f.name] = to_data(getattr(obj, f.name))
        return out
    if isinstance(obj, (tuple, list)):
        if obj and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in obj):
            return {k: to_data(v) for k, v in obj}
        return [to_data(x) for x in obj]
    return obj


def program_to_data(program: Program) -> dict[str, Any]:
    return {"filename": program.filename, "dims": to_data(program.dims), "consts": to_data(program.consts),
            "blocks": to_data(program.blocks)}
