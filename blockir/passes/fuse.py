"""Transform: residual boundaries → one fused add+norm op.

A boundary is the chain ``branch → [dropout] → [scale] → add(shortcut) → norm``,
with an optional constant scale on the shortcut (DeepNorm). It covers Pre-LN
(the sum is the next residual and its norm feeds the next branch), Post-LN (the
norm of the sum is the next state) and scaled shortcuts. A chain is fused only
when the fused op can reproduce it exactly and nothing else needs a value the
fused op does not return:

  dropout → keep only if element-wise (the kernel draws one bit per element)
  every absorbed value (dropped branch, scaled branch, scaled shortcut) has one user
  the norm is a LayerNorm or RMSNorm over the model axis, accumulating in fp32
  no cast sits inside the chain (the op casts the update to the residual dtype itself)
  a (1 + g) gain, and a norm whose offset the kernels lack, stay unfused
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from blockir.norms import family
from blockir.ir.decls import KindDecl
from blockir.ir.program import Block, Program
from blockir.ir.traits import Scales, Stochastic
from blockir.ops import Op
from blockir.passes import op_kinds as K
from blockir.passes.manager import Pass, program_pass


@dataclass(frozen=True)
class Chain:
    add: Op
    norm: Op
    absorbed: tuple[Op, ...]
    fused: Op


def _single_use(block: Block, value: str) -> bool:
    return len(block.users.get(value, ())) == 1


def _match(block: Block, add: Any) -> Chain | None:
    norms = [u for u in block.users.get(add.result, ()) if K.plain_norm(u)]
    if not norms:
        return None
    norm: Any = norms[0]
    decl = block.decl_map[norm.decl]
    if not isinstance(decl, KindDecl) or decl.category != "norm" or not family(decl).fuses(decl) \
            or len(decl.arg("axes")) != 1:
        return None
    if decl.arg("accum") != "f32" or not family(decl).weight(decl):  # fp32 statistics and an RMS weight only
        return None
    if block.type_of(add.result).last is None or decl.arg("axes")[0] != block.type_of(add.result).last.name:
        return None
    absorbed: list[Op] = [add, norm]
    shortcut, shortcut_factor = add.lhs, None
    lhs: Any = block.producers[add.lhs]
    if lhs.has(Scales) and lhs.factor is not None and _single_use(block, lhs.result):
        shortcut, shortcut_factor = lhs.operand, lhs.factor
        absorbed.append(lhs)
    value = add.rhs
    branch_factor = branch_param = None
    producer: Any = block.producers[value]
    gain = block.decl_map.get(getattr(producer, "param", None) or "")
    # the kernels multiply by the stored gain itself; a (1 + g) gain stays outside as its own op
    if producer.has(Scales) and _single_use(block, value) \
            and not (isinstance(gain, KindDecl) and gain.arg("offset", 0)):
        branch_factor, branch_param = producer.factor, producer.param
        absorbed.append(producer)
        value = producer.operand
        producer = block.producers[value]
    p = site = None
    mask = "element"
    if producer.has(Stochastic) and _single_use(block, value):
        if producer.mask != "element":
            return None
        p, site = producer.p, producer.result
        absorbed.append(producer)
        value = producer.operand
    fused = K.fused_add_norm(norm.result, add.result, norm.type, add.type, norm.decl, value, shortcut, p=p, mask=mask,
                             branch_factor=branch_factor, branch_param=branch_param,
                             shortcut_factor=shortcut_factor, site=site, span=add.span)
    return Chain(add, norm, tuple(absorbed), fused)


def fuse_block(block: Block) -> tuple[Block, list[Chain]]:
    chains: list[Chain] = []
    taken: set[int] = set()
    for op in block.ops:
        if K.residual_add(op) and not op.inplace:  # type: ignore[union-attr]
            chain = _match(block, op)
            if chain is not None and not any(id(a) in taken for a in chain.absorbed):
                chains.append(chain)
                taken.update(id(a) for a in chain.absorbed)
    if not chains:
        return block, []
    at_add = {id(c.add): c.fused for c in chains}
    ops = []
    for op in block.ops:
        if id(op) in at_add:
            ops.append(at_add[id(op)])
        elif id(op) not in taken:
            ops.append(op)
    return replace(block, ops=tuple(ops)), chains


def fuse_program(program: Program) -> tuple[Program, bool]:
    """Fuse every legal boundary of every block; returns (program, changed)."""
    blocks, changed = [], False
    for b in program.blocks:
        fused, chains = fuse_block(b)
        blocks.append(fused)
        changed |= bool(chains)
    return replace(program, blocks=tuple(blocks)), changed


FUSE: Pass[None] = program_pass("fuse", fuse_program)
