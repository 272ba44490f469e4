"""Per-kind hook tables: behaviour a later stage needs from each op kind, registered by the kind's own file.

A table maps an op kind to one function. ``blockir/ops/<kind>.py`` registers its entries when the
``blockir.ops`` package is imported, so a stage reads ``TABLE.of(op)`` and never lists op classes.
A hook that needs torch receives the stage's builder as an argument and does not import torch
itself, so checking a file never loads torch. ``missing()`` lets a test require that every kind
fills every table it must.
"""
from __future__ import annotations

from typing import Any, Callable


class HookTable:
    """One named behaviour, one function per op kind (looked up along the kind's MRO)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._by_kind: dict[type, Callable[..., Any]] = {}

    def register(self, *kinds: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def add(fn: Callable[..., Any]) -> Callable[..., Any]:
            for kind in kinds:
                if kind in self._by_kind:
                    raise ValueError(f"{self.name}: {kind.__name__} registered twice")
                self._by_kind[kind] = fn
            return fn
        return add

    def get(self, op: Any) -> Callable[..., Any] | None:
        for kind in type(op).__mro__:
            if kind in self._by_kind:
                return self._by_kind[kind]
        return None

    def of(self, op: Any) -> Callable[..., Any]:
        fn = self.get(op)
        if fn is None:
            raise LookupError(f"no {self.name} hook for {type(op).__name__}")
        return fn

    def missing(self, kinds: list[type]) -> list[str]:
        return [k.__name__ for k in kinds if not any(c in self._by_kind for c in k.__mro__)]


# The tables stages read. Analyses' tables are filled by the kinds' analysis-hook sections, the
# lowering tables by their lowering-hook sections (see the two headings at the end of each kind's file).
LAYOUT = HookTable("layout")            # analyses/layouts: how an op maps its operands' layouts to its results
KEYS = HookTable("keys")                # analyses/keys: the state-dict keys an op's declarations own
EQUIVALENCE = HookTable("equivalence")  # analyses/equivalence: the fields that decide whether two ops are equal
FX_LOWERING = HookTable("fx lowering")  # lower/fx: (op, builder) -> the fx values of its results
FUSED_LOWERING = HookTable("fused lowering")  # lower/fused: kinds the fused backend lowers differently
COST = HookTable("cost")                # reports/cost: (op, ledger) -> flops and bytes of the op


class ConstructTable:
    """The op kind each construct of the language builds, registered by the kind's own file.

    ``BUILD.register(Kind, "a + b")`` files a function under the surface constructs the kind is written
    as; the frontend reads ``BUILD.of("a + b")`` once it has checked the syntax and lowered the operands,
    so it never names a kind. Each function takes the frontend's lowering context first (it offers
    ``type_of(value)`` and ``err(code, message, span, hint)``), then what its construct documents, and
    returns the op, or None after reporting why there is none.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._by_construct: dict[str, tuple[type, Callable[..., Any]]] = {}
        self._functions: dict[str, tuple[str, tuple[str, ...]]] = {}

    def register(self, kind: type, *constructs: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def add(fn: Callable[..., Any]) -> Callable[..., Any]:
            for c in constructs:
                if c in self._by_construct:
                    raise ValueError(f"{self.name}: construct {c!r} registered twice")
                self._by_construct[c] = (kind, fn)
            return fn
        return add

    def of(self, construct: str) -> Callable[..., Any]:
        if construct not in self._by_construct:
            raise LookupError(f"no {self.name} hook for {construct!r}")
        return self._by_construct[construct][1]

    def constructs(self) -> dict[str, type]:
        """Each registered construct and the kind it builds."""
        return {c: kind for c, (kind, _) in self._by_construct.items()}

    def function(self, kind: type, name: str, *keywords: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a built-in function written ``name(x, key=c, …)``: one tensor and required constant
        keywords. The frontend lowers such a call and hands the tensor and the constants (by keyword) to
        the kind's function, so a new function needs no frontend code."""
        construct = f"{name}(x{''.join(f', {k}=c' for k in keywords)})"
        self._functions[name] = (construct, keywords)
        return self.register(kind, construct)

    def functions(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """Each registered built-in function's name: its construct and keywords."""
        return dict(self._functions)


BUILD = ConstructTable("build")  # frontend/lowering: the op a checked construct of the language becomes
