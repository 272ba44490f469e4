"""What every recipe shares: its result, its errors, the pass it runs as, and a small editor for one block's ops.

A recipe rewrites the IR of one block (and, where its contract says so, the
final norm of the models that stack it), then prints the program and parses
it back, so the result is ordinary IR with the builder's own types. It runs
as a pass through the pass manager, which verifies what it returns. Edits are
collected per op (insert before, replace, drop) and value renames are applied
to every op emitted afterwards.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

from blockir.analyses.sizes import layer_counts, program_env
from blockir.analyses.structure import Sublayer, decl_kind, wrapper
from blockir.api import parse
from blockir.diagnostics import BlockError, Diagnostic, render
from blockir.ir import consts as C
from blockir.ir.decls import Decl, InstanceDecl, KindDecl
from blockir.ir.kinds import KINDS
from blockir.ir.printer import format_program
from blockir.ir.program import Block, Const, Program
from blockir.ir.traits import Calls, Scales
from blockir.ops import Op
from blockir.passes import op_kinds as K
from blockir.passes.manager import Pass, PassResult, run_pass

# branch kinds whose value/output and MLP matrices an ``init_gain`` reaches (Q and K keep gain 1)
GAINED_KINDS = tuple(kind for kind, spec in KINDS.items() if spec.arg("init_gain") is not None)


class RecipeError(Exception):
    """The recipe does not apply to this block; the message says why and what would."""


@dataclass(frozen=True)
class Report:
    """What a recipe did: its constants, the graph changes, and the parts of the paper contract it leaves out."""

    recipe: str
    block: str
    constants: tuple[tuple[str, float], ...]
    changes: tuple[str, ...]
    notes: tuple[str, ...]

    def __str__(self) -> str:
        lines = [f"{self.recipe} on {self.block}"]
        lines += [f"  {name} = {value:.6g}" for name, value in self.constants]
        lines += [f"  - {c}" for c in self.changes]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass(frozen=True)
class RecipeResult:
    """The new program and its initialisation.

    ``init(module)`` sets weights of a module compiled from ``program`` that the IR cannot state
    (data-dependent values); it is None when the declarations carry the whole initialisation
    (``init_gain``, ``scalar(init=…)``, ``vector(init=…)``), which ``blockir.compile`` applies.
    """

    program: Program
    init: Callable[[Any], None] | None
    report: Report


def recipe_pass(name: str) -> Callable[[Callable[..., RecipeResult]], Callable[..., RecipeResult]]:
    """Run a recipe's ``rewrite(program, block_name, **options)`` as the pass ``name`` through the manager,
    which verifies the program it returns."""
    def wrap(rewrite: Callable[..., RecipeResult]) -> Callable[..., RecipeResult]:
        @functools.wraps(rewrite)
        def apply(program: Program, block_name: str, **options: Any) -> RecipeResult:
            def run(p: Program) -> PassResult[RecipeResult]:
                result = rewrite(p, block_name, **options)
                return PassResult(result.program, True, result)
            return run_pass(program, Pass(name, run)).detail
        return apply
    return wrap


# --- constant expressions ---------------------------------------------------------------------------

def num(v: float | int) -> C.ConstExpr:
    return C.Num(v)


def name(n: str) -> C.ConstExpr:
    return C.Name(n)


def binop(op: str, a: C.ConstExpr, b: C.ConstExpr) -> C.ConstExpr:
    return C.Bin(op, a, b)


# --- the editor -------------------------------------------------------------------------------------

def rename_operands(op: Op, names: dict[str, str]) -> Op:
    """``op`` reading ``names[v]`` wherever it read ``v``."""
    return op.reading(names)  # type: ignore[return-value]


class BlockEdit:
    """Collects edits of one block and builds the edited block."""

    def __init__(self, block: Block):
        self.block = block
        self.before: dict[int, list[Op]] = {}
        self.after: dict[int, list[Op]] = {}
        self.replaced: dict[int, Op] = {}
        self.dropped: set[int] = set()
        self.renames: dict[str, str] = {}
        self.removed_norms: set[str] = set()
        self.decls: list[Decl] = list(block.decls)
        self.consts: list[Const] = list(block.consts)
        taken = [int(v[1:]) for v in block.producers if v.startswith("%") and v[1:].isdigit()]
        self._next = max(taken, default=-1) + 1

    def fresh(self) -> str:
        v = f"%{self._next}"
        self._next += 1
        return v

    def current(self, op: Op) -> Op:
        return self.replaced.get(id(op), op)

    def insert_before(self, anchor: Op, new: Op) -> None:
        self.before.setdefault(id(anchor), []).append(new)

    def insert_after(self, anchor: Op, new: Op) -> None:
        self.after.setdefault(id(anchor), []).append(new)

    def substitute(self, op: Op, new: Op) -> None:
        self.replaced[id(op)] = new

    def drop(self, op: Op) -> None:
        self.dropped.add(id(op))

    def rename(self, old: str, new: str) -> None:
        """Every later reader of ``old`` reads ``new``."""
        self.renames[old] = new

    def scale(self, anchor: Op, value: str, *, factor: C.ConstExpr | None = None, param: str | None = None) -> str:
        """Insert ``factor * value`` (or ``param * value``) before ``anchor``; returns the scaled value."""
        result = self.fresh()
        self.insert_before(anchor, K.scale(result, self.block.type_of(value), value, factor=factor, param=param))
        return result

    def reroute(self, op: Op, old: str, new: str) -> None:
        """``op`` alone reads ``new`` where it read ``old``."""
        self.substitute(op, rename_operands(self.current(op), {old: new}))

    def add_decl(self, decl: KindDecl) -> None:
        if decl.name in self.block.decl_map or any(c.name == decl.name for c in self.consts):
            raise RecipeError(f"'{self.block.name}' already declares '{decl.name}'")
        self.decls.append(decl)

    def add_const(self, const_name: str, expr: C.ConstExpr) -> None:
        if const_name in self.block.decl_map or any(c.name == const_name for c in self.consts):
            raise RecipeError(f"'{self.block.name}' already defines '{const_name}'")
        self.consts.append(Const(const_name, expr))

    def set_arg(self, decl_name: str, arg: str, expr: Any) -> None:
        """Give declaration ``decl_name`` the argument ``arg`` (arguments stay in the kind's table order)."""
        def with_arg(d: KindDecl) -> KindDecl:
            given = dict(d.args, **{arg: expr})
            return replace(d, args=tuple((a.name, given[a.name]) for a in d.spec.args if a.name in given))
        self.decls = [with_arg(d) if isinstance(d, KindDecl) and d.name == decl_name else d for d in self.decls]

    def remove_norm(self, op: Any) -> None:
        """Delete a norm: its readers read its input. A single-use temporary input takes the norm's name."""
        producer = self.block.producers.get(op.operand)
        users = self.block.users.get(op.operand, ())
        if op.operand.startswith("%") and len(users) == 1 and producer is not None and \
                (K.residual_add(producer) or producer.has(Scales) or producer.has(Calls)):
            self.substitute(producer, replace(self.current(producer), result=op.result))
        else:
            self.rename(op.result, op.operand)
        self.drop(op)
        self.removed_norms.add(op.decl)

    def build(self) -> Block:
        out: list[Op] = []
        for op in self.block.ops:
            out += [self._renamed(new) for new in self.before.get(id(op), [])]
            if id(op) not in self.dropped:
                out.append(self._renamed(self.current(op)))
            out += [self._renamed(new) for new in self.after.get(id(op), [])]
        used = {getattr(op, "decl", None) for op in out}
        # a norm whose every site was removed leaves no state behind
        decls = tuple(d for d in self.decls if d.name not in self.removed_norms - used)
        return replace(self.block, ops=tuple(out), decls=decls, consts=tuple(self.consts))

    def _renamed(self, op: Op) -> Op:
        names = {}
        for v in op.operands:
            target = v
            while target in self.renames:
                target = self.renames[target]
            if target != v:
                names[v] = target
        return rename_operands(op, names) if names else op


def _line(op: Op) -> str:
    return f"line {op.span.line}" if op.span.line else "a residual add"


def scaled_post_ln(edit: BlockEdit, s: Sublayer, recipe: str, *, factor: C.ConstExpr | None = None,
                   param: str | None = None) -> str:
    """Rewrite one sequential sublayer to ``norm(scale * state + branch)`` and say what changed.

    A Post-LN sublayer only gains the shortcut scale. A Pre-LN one, ``state + f(norm(state))``, becomes
    ``norm(scale * state + f(state))``: its norm moves behind the sum and keeps its declaration.
    """
    block = edit.block
    add = s.root
    if not K.residual_add(add) or len(s.adds) != 1 or len(s.branches) != 1:
        raise RecipeError(f"{recipe} rewrites sequential sublayers (one branch per add); the add at {_line(add)} "
                          f"of '{block.name}' joins {len(s.branches)} branches")
    b = s.branches[0]
    if s.shortcut != s.state or s.shortcut_ops:
        raise RecipeError(f"the shortcut of the add at {_line(add)} is not the plain state (it is scaled, dropped "
                          f"or projected); {recipe} sets the shortcut scale itself")
    if b.out_norm is not None or (s.post_norm is not None and b.pre_norms):
        raise RecipeError(f"the sublayer at {_line(add)} normalizes its branch input and output or its sum twice; "
                          f"{recipe} needs Post-LN or Pre-LN (it moves the norm behind the sum)")
    if s.post_norm is not None:
        scaled = edit.scale(add, s.state, factor=factor, param=param)
        edit.reroute(add, s.state, scaled)
        return f"'{s.post_norm.decl}': shortcut scaled inside its Post-LN sum"
    pre: Any = b.pre_norms[0] if len(b.pre_norms) == 1 else None
    if pre is None or not K.plain_norm(pre) or pre.operand != s.state:
        raise RecipeError(f"the sublayer at {_line(add)} has no norm to place behind its sum; {recipe} trains a "
                          "Post-LN stack and reuses the block's own norm declarations")
    edit.drop(pre)
    edit.rename(pre.result, s.state)
    scaled = edit.scale(add, s.state, factor=factor, param=param)
    edit.reroute(add, s.state, scaled)
    total = edit.fresh()
    edit.substitute(add, replace(edit.current(add), result=total))
    edit.insert_after(add, K.norm(add.result, pre.type, pre.decl, total))
    return f"'{pre.decl}': Pre-LN -> Post-LN, the norm moved behind the scaled sum"


# --- programs ---------------------------------------------------------------------------------------

def replace_blocks(program: Program, blocks: Iterable[Block]) -> Program:
    new = {b.name: b for b in blocks}
    return replace(program, blocks=tuple(new.get(b.name, b) for b in program.blocks))


def finish(program: Program) -> Program:
    """Print and parse back: the result is ordinary IR with the builder's own types (the pass manager verifies
    it), or the recipe fails with the parser's diagnostics."""
    text = format_program(program)
    try:
        return parse(text, program.filename)
    except BlockError as exc:
        raise RecipeError("the rewritten program does not parse:\n" + _render(exc.diagnostics, program, text)) from None


def _render(diags: list[Diagnostic], program: Program, text: str) -> str:
    return "\n".join(render(d, {program.filename: text}) for d in diags)


def target_block(program: Program, block_name: str) -> Block:
    if block_name not in program.block_map:
        raise RecipeError(f"no block named '{block_name}' (blocks: {', '.join(program.block_map) or 'none'})")
    block = program.block(block_name)
    if any(K.fused_boundary(op) for op in block.ops):
        raise RecipeError(f"'{block_name}' is already fused; apply recipes to the unfused program")
    return block


def sublayers(block: Block) -> tuple[Sublayer, ...]:
    subs = wrapper(block).sublayers
    if not subs:
        raise RecipeError(f"'{block.name}' has no residual add: a recipe changes residual updates")
    return subs


def stack_depths(program: Program, block_name: str) -> tuple[int, ...]:
    """The layer counts of the stacks that instantiate ``block_name`` (1 when it is used alone or not at all)."""
    return layer_counts(program, program_env(program)).get(block_name, (1,))


def gained_branches(block: Block, recipe: str) -> list[KindDecl]:
    """The branch declarations an init gain applies to; every branch must be a built-in attention or MLP."""
    out: list[KindDecl] = []
    for s in sublayers(block):
        for b in s.branches:
            decl = block.decl_map.get(getattr(b.call, "decl", "") or "")
            if not isinstance(decl, KindDecl) or decl.kind not in GAINED_KINDS:
                what = f"'{b.name}' ({b.kind})"
                raise RecipeError(f"{recipe} initialises the value/output and MLP matrices of every branch, but "
                                  f"{what} is not a built-in attention or MLP whose matrices blockir owns; declare it "
                                  f"as one of {', '.join(GAINED_KINDS)}")
            if decl not in out:
                out.append(decl)
    return out


def has_cross_attention(block: Block) -> bool:
    """Whether the block reads encoder memory: it is the decoder of an encoder–decoder."""
    return any(op.has(Calls) and decl_kind(block, op) == "cross_attention" for op in block.ops)


def models_stacking(program: Program, block_name: str) -> list[Block]:
    return [b for b in program.blocks
            if any(isinstance(d, InstanceDecl) and d.block == block_name for d in b.decls)]


def drop_final_norms(program: Program, block_name: str) -> tuple[list[Block], list[str]]:
    """Remove each norm applied directly to a call of ``block_name`` in the blocks that use it."""
    edited, removed = [], []
    for owner in models_stacking(program, block_name):
        edit = BlockEdit(owner)
        calls = {op.result for op in owner.ops if op.has(Calls)
                 and getattr(owner.decl_map.get(op.decl), "block", None) == block_name}  # type: ignore[union-attr]
        for op in owner.ops:
            if K.plain_norm(op) and op.operand in calls:  # type: ignore[union-attr]
                edit.remove_norm(op)
                removed.append(f"{owner.name}.{op.decl}")
        edited.append(edit.build())
    return edited, removed


def remove_all_norms(program: Program, block_name: str, block: Block, edit: "BlockEdit") -> tuple[list[Block], list[str]]:
    """Remove every norm of ``block`` (through ``edit``) and the final norms of the models that stack it:
    the edited models and the change lines, for a recipe whose contract is no normalization at all."""
    norms = [op for op in block.ops if K.plain_norm(op)]
    for op in norms:
        edit.remove_norm(op)
    changes = [f"removed norm '{d}'" for d in dict.fromkeys(op.decl for op in norms)]
    models, removed = drop_final_norms(program, block_name)
    return models, changes + [f"removed the final norm {r}" for r in removed]
