"""Compare two blocks: identical, renamed keys, the same function, or where they first differ.

Equality is decided by :mod:`blockir.analyses.equivalence`, the canonical form the migration's
function check uses too: constants folded, names resolved, value names and line order left out,
calls compared through the blocks they call. When the functions differ, the first op on each side
without a counterpart on the other is shown, in the innermost pair of blocks of one name that
differ. Two blocks with the same parameter keys and shapes but different functions are the
checkpoint trap: same tensors, different function.
"""
from __future__ import annotations

from dataclasses import dataclass

from blockir.analyses import equivalence as E
from blockir.analyses.keys import key_layout, param_keys
from blockir.diagnostics import BlockError
from blockir.ir.printer import format_decl, format_op
from blockir.ir.program import Block, Program
from blockir.ops import Op


def _decl(block: Block, name: str | None) -> str:
    decl = block.decl_map.get(name or "")
    return format_decl(decl) if decl is not None else str(name)


@dataclass(frozen=True)
class BlockDiff:
    a: Block
    b: Block
    category: str  # one of equivalence.CATEGORIES
    first_a: Op | None  # the first op of a with no counterpart in b (functions differ)
    first_b: Op | None
    where_a: Block  # the blocks those ops belong to
    where_b: Block
    same_keys: bool | None  # None when the keys could not be sized
    key_changes: tuple[str, ...]  # "+key [shape]" / "-key [shape]"
    signature_changed: bool

    @property
    def identical(self) -> bool:
        return self.category == E.IDENTICAL

    @property
    def same_function(self) -> bool:
        return self.category != E.DIFFERENT

    @property
    def verdict(self) -> str:
        if self.category == E.IDENTICAL:
            return "identical"
        if self.category == E.RENAMED:
            return "same function, renamed parameter keys (same shapes)"
        if self.category == E.SAME_FUNCTION:
            if self.same_keys is None:
                return "same function (parameter keys not compared: some dims have no size)"
            return "same function, different parameter keys"
        if self.same_keys:
            return "same parameter keys and shapes, different function"
        if self.same_keys is None:
            return "different function (parameter keys not compared: some dims have no size)"
        return "different function and different parameter keys"


def _keys(program: Program, block: Block) -> dict[str, tuple] | None:
    try:
        table = param_keys(program, block.name)
    except BlockError:  # a dim without a size: keys are not compared
        return None
    return table.shapes | {f"{p}.*": ("extern",) for p in table.unknown}


def _layout(program: Program, block: Block) -> tuple | None:
    try:
        return key_layout(program, block.name)
    except BlockError:  # a dim without a size: keys are not compared
        return None


def _key_changes(pa: Program, a: Block, pb: Program, b: Block) -> tuple[bool | None, tuple[str, ...]]:
    if _layout(pa, a) == _layout(pb, b) is not None:  # equal layouts: equal keys, without writing layers out
        return True, ()
    ka, kb = _keys(pa, a), _keys(pb, b)
    if ka is None or kb is None:
        return None, ()
    changes = [f"-{k} {list(v)}" for k, v in ka.items() if kb.get(k) != v]
    changes += [f"+{k} {list(v)}" for k, v in kb.items() if ka.get(k) != v]
    return not changes, tuple(changes)


def diff_blocks(pa: Program, a: Block, pb: Program, b: Block) -> BlockDiff:
    c = E.compare(pa, a, pb, b)
    signature_changed = [str(p.type) for p in a.params] != [str(p.type) for p in b.params] \
        or [str(t) for t in a.results] != [str(t) for t in b.results]
    same_keys, changes = (True, ()) if c.same_names else _key_changes(pa, a, pb, b)
    same_shapes = False
    if c.same_function and same_keys is False:
        ka, kb = _keys(pa, a), _keys(pb, b)
        same_shapes = ka is not None and kb is not None and sorted(map(str, ka.values())) == \
            sorted(map(str, kb.values()))
    category = E.category(c, same_keys, same_shapes)
    return BlockDiff(a, b, category, c.first_a, c.first_b, c.where_a, c.where_b, same_keys, changes,
                     signature_changed)


def format_diff(d: BlockDiff, name_a: str, name_b: str) -> str:
    lines = [f"--- {name_a}: {d.a.kind} {d.a.name}", f"+++ {name_b}: {d.b.kind} {d.b.name}"]
    if not d.same_function:
        if d.signature_changed:
            lines.append(f"  signature: ({', '.join(str(p.type) for p in d.a.params)}) -> {d.a.result}  vs  "
                         f"({', '.join(str(p.type) for p in d.b.params)}) -> {d.b.result}")
        lines.append("  first difference:")
        for name, op in ((name_a, d.first_a), (name_b, d.first_b)):
            text = _describe(op)
            where = str(op.span) if op is not None else name
            lines.append(f"    {where}: {text}")
        decl_a, decl_b = (getattr(op, "decl", None) for op in (d.first_a, d.first_b))
        if decl_a is not None and decl_a == decl_b and _decl(d.where_a, decl_a) != _decl(d.where_b, decl_b):
            lines.append(f"    declarations: {_decl(d.where_a, decl_a)}  vs  {_decl(d.where_b, decl_b)}")
    if not d.identical:
        lines += [f"  {c}" for c in d.key_changes]
    lines.append(d.verdict)
    return "\n".join(lines)


def _describe(op: Op | None) -> str:
    return format_op(op) if op is not None else "(nothing: every op has a counterpart)"
