"""The tensor-parallel plan of a mixture of experts: tensor parallelism inside every expert, no expert parallelism.

Each expert is a gated MLP, split as one: its gate and up rows by hidden units (the stored ``gate_up_proj``
[E, 2H, D] holds a rank's gate rows and up rows as its slice of each of two equal blocks of dim 1, which is
how it is stored), its ``down_proj`` [E, D, H] by the same units (a plain shard of dim 2). The router is replicated
and computed on the full rows, so every rank picks the same experts with the same weights; the weighted
sum of the experts' outputs is then a sum over ranks of their units' products, a pending sum like an MLP's
output. A shared expert splits the same way and its gate (one logit per row) is replicated: scaling a
pending sum by a whole factor leaves it a pending sum, so the routed and shared parts are added on each
rank and reduced once per branch, and the branch input is gathered once.

Every gradient of a replicated parameter here is a pending sum over ranks: the router's logits receive
the gradient of the routing weights, which multiply each rank's partial expert outputs.

Under the context layout every rank holds every expert whole and routes its own rows: each row's experts and
weights depend on that row alone, so the branch sends nothing, as an MLP there, and each weight's gradient is
the sum of the ranks' rows' contributions.
"""
from __future__ import annotations

from typing import Any

from blockir.analyses.parallel_placements import SUMMED, stacked
from blockir.analyses.sizes import Sizes
from blockir.diagnostics import BlockError, error
from blockir.ir.decls import KindDecl
from blockir.ir.kinds import layer_names
from blockir.ir.program import Block

STYLE, CONTEXT_STYLE = "moe", "context_moe"


def _units(d: KindDecl, what: str, units: int, world: int) -> None:
    if units % world:
        raise BlockError([error(
            "E0645", f"moe '{d.name}' has {units} {what}, which {world} ranks cannot split evenly", d.span,
            hint=f"tensor parallelism splits each expert by hidden units: choose a degree that divides {units}")])


def plan_moe(planner: Any, d: KindDecl, path: str, layer: str, sizes: Sizes, block: Block) -> bool:
    """Place ``d``'s keys (``planner`` is the plan's ``_Planner``) and count its collectives: one gather of
    the branch input, one reduction of the output, as an MLP branch has; none under the context layout."""
    names = layer_names(d.kind, dict(d.args))
    context = planner.layout == "context"
    shared = d.arg("shared")
    if not context:
        _units(d, "hidden units per expert", sizes.dim(d.arg("hidden")), planner.world)
        if shared is not None:
            _units(d, "hidden units in its shared expert", sizes.dim(shared), planner.world)
    planner.styled(path, CONTEXT_STYLE if context else STYLE, d.kind)

    def place(key: str, placement: str) -> None:
        planner._param(key, SUMMED if context else placement)

    place(f"{path}.{names['router']}.weight", SUMMED)
    experts = f"{path}.{names['experts_name']}"
    place(f"{experts}.gate_up_proj", stacked(2, 1))  # each expert's [2H, D]: gate rows, then up rows
    place(f"{experts}.down_proj", "shard(2)")
    if shared is not None:
        sub = f"{path}.{names['shared_expert']}"
        for name, placement in (("gate_proj", "shard(0)"), ("up_proj", "shard(0)"), ("down_proj", "shard(1)")):
            place(f"{sub}.{name}.weight", placement)
        if d.arg("shared_gate"):
            place(f"{path}.{names['shared_expert_gate']}.weight", SUMMED)
    if not context:
        planner._gathered(layer, path, partial=True)
        planner._reduced(layer, path)
    return True
