"""Constant environments: what every name in a constant expression is worth, per layer.

A block's constants may use ``layer`` and ``num_layers``; a block stacked
``N`` times is evaluated once per distinct environment that can change an
expression's value, so the cost stays independent of ``N`` unless the
expression really depends on the layer index.
"""
from __future__ import annotations

from typing import Iterator, Mapping

from blockir.ir import consts as C
from blockir.ir.decls import InstanceDecl
from blockir.ir.program import Block, Program

Env = dict[str, float | int]


def program_env(program: Program, overrides: Mapping[str, int] | None = None) -> Env:
    """Dim sizes and file constants that evaluate; names without a value are left out."""
    overrides = dict(overrides or {})
    env: Env = {}
    for d in program.dims:
        if d.name in overrides:
            env[d.name] = int(overrides[d.name])
        elif d.size is not None:
            _bind(env, d.name, d.size)
    for c in program.consts:
        _bind(env, c.name, c.value)
    return env


def _bind(env: Env, name: str, expr: C.ConstExpr) -> None:
    try:
        env[name] = C.evaluate(expr, env)
    except C.ConstError:
        pass  # an unevaluable constant is reported by the builder; analyses treat it as unknown


def block_env(base: Mapping[str, float | int], block: Block, layer: int = 0, num_layers: int = 1) -> Env:
    """``base`` plus the layer index and count, then the block's own constants in order."""
    env: Env = dict(base)
    env[C.LAYER] = layer
    env[C.NUM_LAYERS] = num_layers
    for c in block.consts:
        _bind(env, c.name, c.value)
    return env


def value(expr: C.ConstExpr | None, env: Mapping[str, float | int]) -> float | int | None:
    """The value of ``expr`` in ``env``, or None when it cannot be evaluated there."""
    if expr is None:
        return None
    try:
        return C.evaluate(expr, env)
    except C.ConstError:
        return None


def layer_counts(program: Program, base: Mapping[str, float | int] | None = None) -> dict[str, tuple[int, ...]]:
    """For each block, the layer counts of the stacks that instantiate it (1 for a single use)."""
    base = program_env(program) if base is None else base
    counts: dict[str, set[int]] = {}
    for owner in program.blocks:
        instances = [d for d in owner.decls if isinstance(d, InstanceDecl)]
        if not instances:
            continue
        env = block_env(base, owner)
        for d in instances:
            n = value(d.count, env) if d.count is not None else 1
            if n is not None:
                counts.setdefault(d.block, set()).add(int(n))
    return {name: tuple(sorted(ns)) for name, ns in counts.items()}


def uses_layer(expr: C.ConstExpr, block: Block) -> bool:
    """Whether ``expr`` depends on ``layer``, directly or through the block's constants."""
    local = {c.name: c.value for c in block.consts}
    seen: set[str] = set()
    stack = list(C.names_in(expr))
    while stack:
        name = stack.pop()
        if name == C.LAYER:
            return True
        if name in local and name not in seen:
            seen.add(name)
            stack += C.names_in(local[name])
    return False


def contexts(base: Mapping[str, float | int], block: Block, counts: tuple[int, ...],
             per_layer: bool) -> Iterator[tuple[int, int, Env]]:
    """(layer, num_layers, env) for every instantiation that can change a value.

    With ``per_layer`` false only layer 0 of each stack is visited: the
    expression does not read the layer index.
    """
    for n in counts or (1,):
        for layer in range(n if per_layer else 1):
            yield layer, n, block_env(base, block, layer, n)
