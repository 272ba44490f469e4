"""Concrete sizes and constants for one compilation: dims, consts, layer index and count."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from blockir.diagnostics import BlockError, Span, error
from blockir.ir import consts as C
from blockir.ir.program import Block, Program


@dataclass(frozen=True)
class Sizes:
    env: Mapping[str, float | int]
    filename: str

    def value(self, expr: C.ConstExpr) -> float | int:
        try:
            return C.evaluate(expr, self.env)
        except C.ConstError as exc:
            raise BlockError([error("E0701", exc.message, exc.span,
                                    hint="give the size when compiling: dims={'NAME': value}")]) from None

    def dim(self, name: str) -> int:
        if name not in self.env:
            raise BlockError([error("E0701", f"dim '{name}' has no size", Span(self.filename, 1, 1),
                                    hint=f"give it when compiling: dims={{'{name}': …}}")])
        return int(self.env[name])

    def for_block(self, block: Block, layer: int, num_layers: int) -> "Sizes":
        """Bind the layer index and count, then the block's own constants."""
        env = dict(self.env, **{C.LAYER: layer, C.NUM_LAYERS: num_layers})
        scoped = Sizes(env, self.filename)
        for c in block.consts:
            env[c.name] = scoped.value(c.value)
        return scoped


def program_sizes(program: Program, overrides: Mapping[str, int] | None = None) -> Sizes:
    """Evaluate dim sizes and file constants in order; ``overrides`` win over declared sizes."""
    overrides = dict(overrides or {})
    unknown = set(overrides) - set(program.dim_map) - {c.name for c in program.consts} - set(C.LAYER_NAMES)
    if unknown:
        raise BlockError([error("E0702", f"unknown dim(s) in dims=: {', '.join(sorted(unknown))}",
                                Span(program.filename, 1, 1), hint="dims: " + ", ".join(program.dim_map))])
    env: dict[str, float | int] = {C.LAYER: 0, C.NUM_LAYERS: 1}
    sizes = Sizes(env, program.filename)
    for d in program.dims:
        if d.name in overrides:
            env[d.name] = int(overrides[d.name])
        elif d.size is not None:
            env[d.name] = int(sizes.value(d.size))
    for c in program.consts:
        env[c.name] = overrides.get(c.name, sizes.value(c.value))
    for name in C.LAYER_NAMES:
        if name in overrides:
            env[name] = overrides[name]
    return sizes
