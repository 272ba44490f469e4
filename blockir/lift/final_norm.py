"""The norm module a Pre-LN block closes its stream with, written as the model's final norm.

A module that keeps its layers in lists of parts rather than as modules of their own
(x-transformers' (norms, block, residual) lists) lifts as one block holding every update. The norm
module it applies to the stream after the last residual add is its final norm, but written inside
that block — a norm and a gain — it would read as a post-norm of the last update, the placement
the other updates lack. When every update is Pre-LN (each branch reads a normalized state and no
earlier sum is normalized), that module is lifted as a block of its own and the root applies it after
the updates: the root is then a ``model``. The instance is the module itself, so its declarations keep
their keys (``final_norm.gamma``).
"""
from __future__ import annotations

import re

from torch import nn

from blockir.analyses.structure import wrapper
from blockir.api import parse
from blockir.diagnostics import BlockError
from blockir.frontend.scope import RESERVED
from blockir.lift.blocks import Session, emit
from blockir.lift.lifter import Instance, LiftedBlock, Line
from blockir.norms import FAMILIES


def _named(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w.]){re.escape(name)}\b(?!\.)")


def _value(e: Line | Instance) -> str:
    return e.result if isinstance(e, Instance) else e.text.split(" = ", 1)[0]


def _closing(root: LiftedBlock) -> tuple[int, str] | None:
    """Where the equations after the last residual add begin, and the module path they all belong to, when they
    form one chain from that add's result to the block's result that starts with a norm."""
    adds = [i for i, e in enumerate(root.eqs) if isinstance(e, Line) and e.rule == "residual add"]
    if not adds or any(not isinstance(e, Line) or not e.rule for e in root.eqs[adds[-1] + 1:]):
        return None
    tail = [e for e in root.eqs[adds[-1] + 1:] if isinstance(e, Line)]
    chain = [_value(root.eqs[adds[-1]])]
    for e in tail:
        if not e.reads or any(r not in chain for r in e.reads):
            return None
        chain.append(_value(e))
    if len(chain) < 2 or chain[-1] != root.result:
        return None
    used = [d for d in root.decls if any(_named(d).search(e.text) for e in tail)]
    owners = {d.rpartition(".")[0] for d in used}
    norm = next((d for d in used if _named(d).search(tail[0].text)), None)
    if len(owners) != 1 or "" in owners or norm is None or root.decls[norm].text.split("(", 1)[0] not in FAMILIES:
        return None
    owner = owners.pop()
    before = [e.text for e in root.eqs[:adds[-1] + 1] if isinstance(e, Line)]
    if any(d.startswith(owner + ".") and (d not in used or any(_named(d).search(t) for t in before))
           for d in root.decls):
        return None  # the module does more than close the stream
    return adds[-1] + 1, owner


def _pre_ln(root: LiftedBlock, session: Session, module: nn.Module) -> bool:
    """Every update's branches read a normalized state, and no sum but the last is normalized."""
    try:
        program = parse(emit(root, session, module).text, "<lift>")
    except BlockError:
        return False
    subs = wrapper(program.block(root.name)).sublayers
    return bool(subs) and all("pre" in s.placement.split("+") for s in subs) and \
        not any("post" in s.placement.split("+") for s in subs[:-1])


def split_final_norm(root: LiftedBlock, session: Session, module: nn.Module) -> LiftedBlock:
    """``root`` with the norm module closing its Pre-LN stream as a block instance of its own, when it has one."""
    if any(isinstance(e, Instance) for e in root.eqs):
        return root  # its layers are modules: a stack or instances, and the norm after them is the model's already
    found = _closing(root)
    if found is None or not _pre_ln(root, session, module):
        return root
    start, owner = found
    tail = [e for e in root.eqs[start:] if isinstance(e, Line)]
    local = {d: d[len(owner) + 1:] for d in root.decls if d.startswith(owner + ".")}
    state, x = _value(root.eqs[start - 1]), "x"
    names = [*local.values(), *(_value(e) for e in tail)]
    if x in names or any(n in RESERVED for n in local.values()):
        return root
    try:
        sub = module.get_submodule(owner)
    except AttributeError:
        return root  # the declarations are named inside a module, not after one

    def rename(text: str) -> str:
        for long, short in local.items():
            text = _named(long).sub(short, text)
        return _named(state).sub(x, text)

    norm = LiftedBlock("", sub, [(x, root.inputs[0][1])], [x],
                       {local[d]: line for d, line in root.decls.items() if d in local},
                       [Line(rename(e.text), e.site, e.detail, e.rule, tuple(x if r == state else r for r in e.reads))
                        for e in tail], root.result, root.result_span)
    session.name(norm, re.sub(r"\W", "_", type(sub).__name__) or "Norm")
    root.decls = {d: line for d, line in root.decls.items() if d not in local}
    root.eqs = [*root.eqs[:start], Instance(owner, norm, root.result, (state,), Line("", tail[0].site, tail[0].detail))]
    return root
