"""Name resolution shared by the builder: what a name means inside one block."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Iterable

import blockir.ops  # noqa: F401  (importing the kinds registers the functions they are written as)
from blockir.diagnostics import Diagnostic, Note, Span, error
from blockir.ir.consts import LAYER_NAMES
from blockir.ir.hooks import BUILD
from blockir.ir.kinds import FUNCTIONS
from blockir.ir.decls import Decl
from blockir.ir.types import Axis, DType, TensorType



@cache
def kind_functions() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The functions op kinds register in the plain call form (``BUILD.functions``), less the fixed ones the
    frontend lowers itself: each name's construct and keywords."""
    return {n: v for n, v in BUILD.functions().items() if n not in FUNCTIONS}


def builtin_functions() -> tuple[str, ...]:
    return (*FUNCTIONS, *kind_functions())


# names a definition may not take: they would shadow a built-in meaning
RESERVED = {**{n: "is reserved for the layer index and count" for n in LAYER_NAMES},
            **{n: "is a built-in function" for n in builtin_functions()},
            **{d.value: "is a dtype name" for d in DType}}


def suggest(name: str, candidates: Iterable[str]) -> str | None:
    import difflib  # only an error needs it
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"did you mean '{match[0]}'?" if match else None


@dataclass
class Scope:
    """Names visible in one block: dims and constants of the file, then the block's own."""

    dims: dict[str, Axis]
    consts: dict[str, Span]
    diags: list[Diagnostic]
    decls: dict[str, Decl] = field(default_factory=dict)
    values: dict[str, TensorType] = field(default_factory=dict)
    where: dict[str, Span] = field(default_factory=dict)
    # names whose definition failed: uses stay silent instead of cascading
    poisoned: set[str] = field(default_factory=set)

    def define(self, name: str, span: Span, what: str) -> bool:
        """Reserve a name in this block; report a redefinition with a note at the first one."""
        first = self.where.get(name) or (self.consts.get(name) if name in self.consts else None)
        if name in self.dims:
            first = self.dims[name].span
        if first is not None or name in RESERVED:
            notes = [Note("first defined here", first)] if first is not None else []
            reason = RESERVED.get(name, "is already defined")
            self.diags.append(error("E0102", f"{what} '{name}' {reason}", span, notes=notes,
                                    hint="every name in a block is defined once; pick another name"))
            return False
        self.where[name] = span
        return True

    def is_constant(self, name: str) -> bool:
        return name in self.consts or name in self.dims or name in LAYER_NAMES

    def every_name(self) -> list[str]:
        return [*self.values, *self.decls, *self.consts, *self.dims]

    def undefined(self, name: str, span: Span, what: str = "name") -> None:
        self.diags.append(error("E0101", f"undefined {what} '{name}'", span, hint=suggest(name, self.every_name())))
