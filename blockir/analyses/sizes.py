"""The one size environment: what every name in a constant expression is worth.

A program's dims and file constants are evaluated in order, after the
caller's overrides (``dims={...}`` / ``--dims``) are validated: only names
the file declares (dims and file constants), only positive integers, and
never the per-layer names ``layer`` and ``num_layers``, which a stack binds
for each of its layers. Every consumer — keys, cost, the manifest, the
verifiers, inlining and both backends — reads sizes from here, so a size
given once means the same thing everywhere.

Analyses work with partial knowledge (a dim without a size is simply
unknown: :meth:`Sizes.known` returns None); lowering needs every size
(:meth:`Sizes.value`, :meth:`Sizes.dim` and :meth:`Sizes.count` raise a
located ``BlockError``). A stack is evaluated once per distinct environment
that can change an expression's value, so analyses stay independent of its
depth unless an expression reads the layer index.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Integral
from typing import Any, Iterator, Mapping

from blockir.diagnostics import BlockError, Span, error
from blockir.ir import consts as C
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.ir.program import Block, Program
from blockir.ir.types import MAX_DIM, Axis

Env = dict[str, float | int]



def _bind(env: Env, name: str, expr: C.ConstExpr) -> None:
    try:
        env[name] = C.evaluate(expr, env)
    except C.ConstError:
        pass  # an unevaluable constant is reported by the builder; analyses treat it as unknown


def _where(program: Program, name: str) -> Span:
    decl = program.dim_map.get(name) or next((c for c in program.consts if c.name == name), None)
    return decl.span if decl is not None else Span(program.filename, 1, 1)


def _override(program: Program, name: str, raw: Any) -> int:
    dims = ", ".join(program.dim_map) or "none"
    if isinstance(raw, bool) or not isinstance(raw, Integral):
        raise BlockError([error("E0702", f"size of '{name}' must be a positive integer, got {raw!r}",
                                _where(program, name), hint=f"dims: {dims}")])
    value = int(raw)
    if value < 1 or value > MAX_DIM:
        raise BlockError([error("E0702", f"size of '{name}' must be a positive integer up to {MAX_DIM}, got {value}",
                                _where(program, name), hint=f"dims: {dims}")])
    return value


def validate_overrides(program: Program, overrides: Mapping[str, Any] | None) -> dict[str, int]:
    """The overrides as ints, or a BlockError naming the first bad name or value."""
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise BlockError([error("E0702", f"dims must be a mapping of names to sizes, got {type(overrides).__name__}",
                                Span(program.filename, 1, 1))])
    known = set(program.dim_map) | {c.name for c in program.consts}
    unknown = sorted(str(k) for k in overrides if k not in known)
    if unknown:
        layer_names = [n for n in unknown if n in C.LAYER_NAMES]
        hint = "dims: " + (", ".join(program.dim_map) or "none")
        if layer_names:
            hint += f"; '{layer_names[0]}' is bound by each stack for its own layers: change the stack's count instead"
        raise BlockError([error("E0702", f"unknown dim(s) in dims=: {', '.join(unknown)}",
                                Span(program.filename, 1, 1), hint=hint)])
    return {name: _override(program, name, raw) for name, raw in overrides.items()}


@dataclass(frozen=True)
class Sizes:
    """Known names and their values, for one scope (the program, or one layer of one block)."""

    env: Mapping[str, float | int]
    filename: str
    spans: Mapping[str, Span] = field(default_factory=dict, compare=False)  # where each dim is declared

    @classmethod
    def of(cls, program: Program, overrides: Mapping[str, Any] | None = None) -> Sizes:
        """Dims and file constants, overrides first; names that do not evaluate are left out."""
        given = validate_overrides(program, overrides)
        env: Env = {}
        for d in program.dims:
            if d.name in given:
                env[d.name] = given[d.name]
            elif d.size is not None:
                _bind(env, d.name, d.size)
        for c in program.consts:
            if c.name in given:
                env[c.name] = given[c.name]
            else:
                _bind(env, c.name, c.value)
        for d in program.dims:
            v = env.get(d.name)
            if v is not None and (not float(v).is_integer() or not 1 <= v <= MAX_DIM):
                raise BlockError([error("E0702", f"dim '{d.name}' must be a positive integer up to {MAX_DIM}, "
                                        f"got {v!r}", d.span)])
        return cls(env, program.filename, {d.name: d.span for d in program.dims})

    def for_block(self, block: Block, layer: int = 0, num_layers: int = 1) -> Sizes:
        """This scope plus the layer index and count, then the block's own constants in order."""
        env: Env = dict(self.env)
        env[C.LAYER] = layer
        env[C.NUM_LAYERS] = num_layers
        for c in block.consts:
            _bind(env, c.name, c.value)
        return Sizes(env, self.filename, self.spans)

    def known(self, expr: C.ConstExpr | None) -> float | int | None:
        """The value of ``expr`` here, or None when it reads a name without a value."""
        if expr is None:
            return None
        try:
            return C.evaluate(expr, self.env)
        except C.ConstError:
            return None

    def value(self, expr: C.ConstExpr) -> float | int:
        """The value of ``expr``; a located BlockError when a size is missing."""
        try:
            return C.evaluate(expr, self.env)
        except C.ConstError as exc:
            raise BlockError([error("E0701", exc.message, exc.span,
                                    hint="give the size when compiling: dims={'NAME': value} (CLI: --dims NAME=value)")
                              ]) from None

    def dim(self, name: str, span: Span | None = None) -> int:
        if name not in self.env:
            where = span or self.spans.get(name) or Span(self.filename, 1, 1)
            raise BlockError([error("E0701", f"dim '{name}' has no size", where,
                                    hint=f"give it when compiling: dims={{'{name}': …}} (CLI: --dims {name}=…)")])
        return int(self.env[name])

    def axis(self, axis: Axis) -> int:
        """The size of an axis: a declared dim, or one a concat joined (its size is the sum of the parts)."""
        if axis.name not in self.env and axis.size is not None and "+" in axis.name:
            return int(self.value(axis.size))
        return self.dim(axis.name)

    def count(self, expr: C.ConstExpr, what: str, span: Span | None = None) -> int:
        """A positive integer (a layer count, a number of heads); a located BlockError otherwise."""
        v = self.value(expr)
        if not float(v).is_integer() or v < 1:
            raise BlockError([error("E0701", f"{what} must be a positive integer, got {v!r}",
                                    span or Span(self.filename, 1, 1))])
        return int(v)


def program_env(program: Program, overrides: Mapping[str, Any] | None = None) -> Env:
    """The program scope as a plain mapping (what the verifiers read)."""
    return dict(Sizes.of(program, overrides).env)


def block_env(base: Mapping[str, float | int], block: Block, layer: int = 0, num_layers: int = 1) -> Env:
    """``base`` plus the layer index and count, then the block's own constants in order."""
    return dict(Sizes(base, "").for_block(block, layer, num_layers).env)


def value(expr: C.ConstExpr | None, env: Mapping[str, float | int]) -> float | int | None:
    """The value of ``expr`` in ``env``, or None when it cannot be evaluated there."""
    return Sizes(env, "").known(expr)


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


def enclosing_stacks(program: Program, base: Mapping[str, float | int] | None = None
                     ) -> dict[str, tuple[tuple[str, int], ...]]:
    """For each block, (the stacked block it runs in, that stack's layer count): the block itself where a stack
    instantiates it, and each stacked block that instantiates it through single instances (a single instance
    is built with ``num_layers = 1``, whatever the depth of the stack around it)."""
    base = program_env(program) if base is None else base
    out: dict[str, set[tuple[str, int]]] = {}
    for owner in program.blocks:
        env = block_env(base, owner)
        for d in owner.decls:
            n = value(d.count, env) if isinstance(d, InstanceDecl) and d.count is not None else None
            if n is None:
                continue
            todo, seen = [d.block], set()
            while todo:
                name = todo.pop()
                if name in seen or name not in program.block_map:
                    continue
                seen.add(name)
                out.setdefault(name, set()).add((d.block, int(n)))
                todo += [c.block for c in program.block(name).decls if isinstance(c, InstanceDecl) and c.count is None]
    return {name: tuple(sorted(pairs)) for name, pairs in out.items()}


def uses_layer(expr: C.ConstExpr, block: Block, layer_name: str = C.LAYER) -> bool:
    """Whether ``expr`` depends on ``layer`` (or on ``layer_name``), directly or through the block's constants."""
    local = {c.name: c.value for c in block.consts}
    seen: set[str] = set()
    stack = list(C.names_in(expr))
    while stack:
        name = stack.pop()
        if name == layer_name:
            return True
        if name in local and name not in seen:
            seen.add(name)
            stack += C.names_in(local[name])
    return False


def reads_layer(block: Block) -> bool:
    """Whether anything in ``block`` (an op's constant, a declaration's argument, a layer count) depends on
    the layer index, so that layers of a stack of it may differ from each other."""
    exprs: list[Any] = [getattr(op, f, None) for op in block.ops for f in ("p", "factor", "branch_factor",
                                                                         "shortcut_factor")]
    exprs += [v for d in block.decls if isinstance(d, KindDecl) for _, v in d.args]
    exprs += [d.count for d in block.decls if isinstance(d, InstanceDecl)]
    return any(isinstance(e, C.EXPRS) and uses_layer(e, block) for e in exprs)


def contexts(base: Mapping[str, float | int], block: Block, counts: tuple[int, ...],
             per_layer: bool) -> Iterator[tuple[int, int, Env]]:
    """(layer, num_layers, env) for every instantiation that can change a value.

    With ``per_layer`` false only layer 0 of each stack is visited: the
    expression does not read the layer index.
    """
    for n in counts or (1,):
        for layer in range(n if per_layer else 1):
            yield layer, n, block_env(base, block, layer, n)
