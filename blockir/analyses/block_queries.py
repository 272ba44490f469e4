"""Questions about one op or one value of a block that the residual analysis and its users share.

They ask the op kinds' traits (``blockir.ir.traits``), never their classes, so a new kind that states
the right traits is understood here without this module naming it.
"""
from __future__ import annotations

from blockir.ir.decls import ExternDecl, InstanceDecl, KindDecl
from blockir.ir.kinds import GATES
from blockir.ir.program import Block
from blockir.ir.traits import (AddNorm, Calls, Complement, Function, Modifier, Normalizes, Product, ResidualSum,
                               Trait)
from blockir.ops import Op

GATE_FUNCTIONS = (*GATES, "tanh")  # bounded squashing functions whose output gates a value


def has(op: Op | None, trait: type[Trait]) -> bool:
    """Whether there is an op and its kind states ``trait``."""
    return op is not None and op.has(trait)


def applies_norm(op: Op | None) -> bool:
    """A norm applied to a value it reads (``op.operand``), as opposed to one fused with the sum it normalizes."""
    return has(op, Normalizes) and not op.has(AddNorm)  # type: ignore[union-attr]


def plain_add(op: Op | None) -> bool:
    """A residual add of two operands (``op.lhs + op.rhs``) with nothing fused into it."""
    return has(op, ResidualSum) and not op.has(AddNorm)  # type: ignore[union-attr]


def sum_of(op: Op) -> str:
    """The value a residual sum defines: the add's result, or a fused add+norm's un-normalized residual."""
    return op.residual if op.has(AddNorm) else op.result  # type: ignore[attr-defined]


def norm_decl(block: Block, op: Op) -> KindDecl | None:
    """The norm declaration a normalizing op computes: its own, or the one an extern add+norm's contract states."""
    decl = block.decl_map.get(getattr(op, "decl", "") or "")
    if isinstance(decl, ExternDecl):
        return decl.contract.norm if decl.contract is not None else None
    return decl if isinstance(decl, KindDecl) else None


def decl_kind(block: Block, op: Op | None) -> str | None:
    decl = block.decl_map.get(getattr(op, "decl", "") or "")
    if isinstance(decl, KindDecl):
        return decl.kind
    if isinstance(decl, ExternDecl):
        return "extern"
    if isinstance(decl, InstanceDecl):
        return decl.kind  # block | stack
    return None


def is_linear(block: Block, op: Op | None) -> bool:
    return has(op, Calls) and decl_kind(block, op) == "linear"


def transparent(op: Op | None) -> bool:
    """Casts, dropout and scales: what they return is still the value they read, for every structural question."""
    return has(op, Modifier)


def state_input(block: Block) -> str | None:
    """The input that carries the residual state: the first whose axes equal the result's."""
    inputs = block.inputs
    for op in inputs:
        if op.type.names == block.result.names:  # type: ignore[union-attr]
            return op.result
    return inputs[0].result if inputs else None


def _gate_rank(block: Block, value: str) -> int:
    """How surely ``value`` is a gate: 2 for a sigmoid or a complement ``1 - z`` (values in [0, 1]),
    1 for tanh or erf (they also squash a candidate update, as in a GRU), 0 for anything else."""
    op = block.producers.get(value)
    if has(op, Complement):
        return 2 if _gate_rank(block, op.operand) else 0  # type: ignore[union-attr]
    fn = op.fn if has(op, Function) else None  # type: ignore[union-attr]
    decl = block.decl_map.get(getattr(op, "decl", "") or "")
    if isinstance(decl, KindDecl) and decl.kind == "activation":
        fn = decl.arg("fn")
    return 2 if fn == "sigmoid" else 1 if fn in GATE_FUNCTIONS else 0


def is_gate(block: Block, value: str) -> bool:
    """Whether ``value`` is a gate: a sigmoid, tanh or erf of something, or one minus a gate."""
    return _gate_rank(block, value) > 0


def gated(block: Block, op: Op | None) -> tuple[str, str] | None:
    """(the gate, the gated value) of a gate product ``z * v``, or None for any other op.

    When both factors could gate, the one surer to lie in [0, 1] is the gate; a tie is no gate.
    """
    if not has(op, Product):
        return None
    lhs, rhs = _gate_rank(block, op.lhs), _gate_rank(block, op.rhs)  # type: ignore[union-attr]
    if lhs > rhs:
        return op.lhs, op.rhs  # type: ignore[union-attr]
    if rhs > lhs:
        return op.rhs, op.lhs  # type: ignore[union-attr]
    return None


def describe(block: Block, value: str) -> str:
    """How a diagnostic names a value: its own name, or the expression that made a temporary."""
    if not value.startswith("%"):
        return f"'{value}'"
    op = block.producers.get(value)
    return op.label() if op is not None else f"'{value}'"


def ancestors(block: Block, value: str) -> set[str]:
    """Every value ``value`` is computed from, itself included."""
    seen: set[str] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        op = block.producers.get(v)
        if op is not None:
            stack += op.operands
    return seen


def embedded(block: Block, v: str) -> bool:
    """Whether ``v`` is where the stream begins: an embedding lookup, or a sum of lookups (token, position and
    type tables), seen through casts, dropout and scales."""
    todo, seen = [v], set()
    while todo:
        u = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        op = block.producers.get(u)
        if transparent(op):
            todo.append(op.operands[0])  # type: ignore[union-attr]
        elif plain_add(op):
            todo += op.operands  # type: ignore[union-attr]
        elif not (has(op, Calls) and decl_kind(block, op) == "embedding"):
            return False
    return True


def stream_norm(block: Block, op: Op | None) -> bool:
    """Whether ``op`` normalizes the stream, as opposed to starting it: a norm of embedding lookups (BLOOM's
    ``word_embeddings_layernorm``, BERT's embedding LayerNorm) is where the stream begins normalized."""
    if applies_norm(op):
        return not embedded(block, op.operand)  # type: ignore[union-attr]
    return has(op, AddNorm)
