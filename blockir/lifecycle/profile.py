"""The depth profile of a run: gradient norms by layer and weight group over steps, and init statistics.

A *layer* is one instance of a stacked block (``layers.3.``), found from the
program's stack declarations, not from key patterns; a *weight group* is a
parameter's key inside its layer (``self_attn.v_proj.weight``), so one group
is one line across depth. Parameters outside every stack (the embedding, the
head, a final norm) are kept by their own names.

After each step the L2 norm of every parameter's gradient is recorded (float64):
a layer's norm is the root of the sum of its groups' squared norms. A recipe
that promises depth-independent updates (Fixup, T-Fixup, DeepNorm,
DeepScaleLM) shows a flat layer profile; Post-LN's gradient vanishing toward
the input shows as a slope.

Init statistics compare, before the first step, the measured spread (the
population standard deviation) of every weight matrix of a built-in branch
with the spread its declaration states, following the roles of
:mod:`blockir.ir.init_roles` in the order the module factory applies them:

* ``init_std=fan_in``: N(0, 1/fan_in), N(0, 2/fan_in) on rectified inputs;
* ``init_gain=g``: Xavier-normal, std g·sqrt(2 / (fan_in + fan_out)) on the
  update-path roles, gain 1 on the query and key;
* ``init_scale=s``: s times the std before it (PyTorch's default Linear init,
  std 1/sqrt(3·fan_in), or Conv1D's 0.02, when nothing else is stated);
* ``init_zero``: the last layer on the update path is exactly zero.

A matrix whose declaration states nothing is measured with no stated value.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import nn

from blockir.analyses.sizes import Sizes
from blockir.ir import init_roles
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.ir.program import Block, Program
from blockir.lower.layers.dense import Conv1D
from blockir.lower.layers.modules import BranchInit

CONV1D_STD = 0.02  # Conv1D's own initialisation (GPT-2's initializer_range)


def layer_paths(program: Program, block: Block, sizes: Sizes, prefix: str = "") -> list[str]:
    """The path of every stacked layer reachable from ``block`` (``layers.0.``, …), in declaration order;
    a stack inside a stacked layer belongs to that layer."""
    out: list[str] = []
    for d in block.decls:
        if not isinstance(d, InstanceDecl):
            continue
        inner = program.block(d.block)
        if d.count is None:
            out += layer_paths(program, inner, sizes.for_block(inner), f"{prefix}{d.name}.")
        else:
            out += [f"{prefix}{d.name}.{i}." for i in range(sizes.count(d.count, f"the layer count of '{d.name}'"))]
    return out


@dataclass
class GradProfile:
    """Gradient norms after every step: per layer, per weight group and layer, and outside the stacks."""

    layers: list[str]  # layer paths without the trailing dot
    groups: list[str] = field(default_factory=list)  # weight groups in first-seen order
    steps: list[int] = field(default_factory=list)
    layer_norms: list[list[float]] = field(default_factory=list)  # [step][layer]
    group_norms: dict[str, list[list[float | None]]] = field(default_factory=dict)  # group -> [step][layer]
    outside: dict[str, list[float | None]] = field(default_factory=dict)  # parameter -> [step]

    def _place(self, name: str) -> tuple[int, str] | None:
        for i, layer in enumerate(self.layers):
            if name.startswith(layer + "."):
                return i, name[len(layer) + 1:]
        return None

    def record(self, step: int, named: list[tuple[str, nn.Parameter]]) -> None:
        """Read the gradients the last backward left on ``named`` (names relative to the compiled block,
        other parameters of the model under their own names)."""
        layer_sq = [0.0] * len(self.layers)
        groups: dict[str, list[float | None]] = {}
        outside: dict[str, float | None] = {}
        for name, p in named:
            norm = None if p.grad is None else float(p.grad.detach().double().norm())
            place = self._place(name)
            if place is None:
                outside[name] = norm
                continue
            i, group = place
            if group not in self.group_norms:
                self.groups.append(group)
                self.group_norms[group] = [[None] * len(self.layers) for _ in self.steps]
            groups.setdefault(group, [None] * len(self.layers))[i] = norm
            layer_sq[i] += (norm or 0.0) ** 2
        self.steps.append(step)
        self.layer_norms.append([math.sqrt(s) for s in layer_sq])
        for group in self.groups:
            self.group_norms[group].append(groups.get(group, [None] * len(self.layers)))
        for name, norm in outside.items():
            self.outside.setdefault(name, [None] * (len(self.steps) - 1)).append(norm)

    def json(self) -> dict[str, object]:
        return {"layers": self.layers, "steps": self.steps, "layer_grad_norm": self.layer_norms,
                "group_grad_norm": self.group_norms, "outside_grad_norm": self.outside}


@dataclass(frozen=True)
class InitStat:
    param: str  # the weight's key in the compiled block
    layer: str | None  # its layer path, None outside every stack
    role: str  # the role the declaration's init arguments address (q, k, v, o, fc1, …)
    std: float  # measured population standard deviation
    stated: float | None  # the std the declaration implies, None where it states no initialisation
    rule: str | None  # which arguments give ``stated``

    @property
    def ratio(self) -> float | None:
        """Measured over stated (None when nothing is stated, or the stated spread is zero)."""
        return self.std / self.stated if self.stated else None


def _fans(m: nn.Module) -> tuple[int, int]:
    w = m.weight  # type: ignore[union-attr]
    return (w.shape[0], w.shape[1]) if isinstance(m, Conv1D) else (w.shape[1], w.shape[0])


def stated_std(init: BranchInit, role: str, m: nn.Module) -> tuple[float | None, str | None]:
    """The std the declaration implies for the matrix of ``role``, and which arguments say so."""
    fan_in, fan_out = _fans(m)
    std, rules = None, []
    if init.fan_in and isinstance(m, nn.Linear):
        rectified = role in init_roles.RECTIFIED.get(init.kind, ())
        std = math.sqrt((2.0 if rectified else 1.0) / fan_in)
        rules.append(f"init_std=fan_in ({2 if rectified else 1}/fan_in)")
    if init.gain is not None:
        gain = init.gain if role in init_roles.GAINED[init.kind] else \
            1.0 if role in init_roles.UNGAINED.get(init.kind, ()) else None
        if gain is not None:
            std = gain * math.sqrt(2.0 / (fan_in + fan_out))
            rules.append(f"init_gain={gain:g} (Xavier-normal)")
    if init.scale is not None and role in init_roles.EARLIER[init.kind]:
        base = std if std is not None else CONV1D_STD if isinstance(m, Conv1D) else 1 / math.sqrt(3 * fan_in)
        std = init.scale * base
        rules.append(f"init_scale={init.scale:g}")
    if init.zero and role == init_roles.LAST[init.kind]:
        std, rules = 0.0, ["init_zero"]
    return std, "; ".join(rules) or None


def _roles(kind: str) -> list[str]:
    tables = (init_roles.UNGAINED, init_roles.GAINED, init_roles.EARLIER, init_roles.RECTIFIED)
    roles = [r for t in tables for r in t.get(kind, ())] + [init_roles.LAST[kind]]
    return list(dict.fromkeys(roles))


def _branches(program: Program, block: Block, sizes: Sizes, prefix: str = "",
              layer: str | None = None) -> Iterator[tuple[str, KindDecl, Sizes, str | None]]:
    """(path, declaration, its sizes, layer path) of every built-in branch declaration reachable from ``block``."""
    for d in block.decls:
        if isinstance(d, KindDecl) and d.kind in init_roles.LAST:
            yield prefix + d.name, d, sizes, layer
        elif isinstance(d, InstanceDecl):
            inner = program.block(d.block)
            if d.count is None:
                yield from _branches(program, inner, sizes.for_block(inner), f"{prefix}{d.name}.", layer)
                continue
            n = sizes.count(d.count, f"the layer count of '{d.name}'")
            for i in range(n):
                path = f"{prefix}{d.name}.{i}"
                yield from _branches(program, inner, sizes.for_block(inner, i, n), path + ".", layer or path)


@torch.no_grad()
def init_stats(program: Program, block: Block, core: nn.Module, sizes: Sizes) -> list[InitStat]:
    """Measured against stated spread of every weight matrix of the built-in branches of ``core``
    (compiled from ``block``, not yet trained)."""
    out = []
    for path, d, scope, layer in _branches(program, block, sizes.for_block(block)):
        module = core.get_submodule(path)
        names: dict[str, str] = getattr(module, "names", {})
        init = BranchInit.of(d, scope)
        for role in _roles(d.kind):
            m = getattr(module, names.get(role, ""), None)
            if not isinstance(m, (nn.Linear, Conv1D)):
                continue  # a fused layout has no separate matrix for this role
            stated, rule = stated_std(init, role, m) if init is not None else (None, None)
            std = float(m.weight.detach().double().std(correction=0))
            out.append(InitStat(f"{path}.{names[role]}.weight", layer, role, std, stated, rule))
    return out


@dataclass
class DepthProfile:
    """What ``blockir run --profile`` reports: the init statistics and the gradient profile of one run."""

    init: list[InitStat]
    grads: GradProfile

    @classmethod
    def start(cls, program: Program, block: Block, core: nn.Module, sizes: Sizes) -> DepthProfile:
        """Measure ``core`` as initialised and prepare to record its gradients."""
        layers = [p[:-1] for p in layer_paths(program, block, sizes.for_block(block))]
        return cls(init_stats(program, block, core, sizes), GradProfile(layers))

    def after_step(self, trainer: object) -> None:
        """Record the gradients of the step ``trainer`` (a session trainer) just took."""
        model: nn.Module = getattr(trainer, "model")
        core = {id(p) for p in model.core.parameters()}  # type: ignore[union-attr]
        named = [(name.split(".", 1)[1] if id(p) in core else name, p) for name, p in model.named_parameters()]
        self.grads.record(getattr(trainer, "step_count"), named)

    def json(self) -> dict[str, object]:
        return {"init": [{"param": s.param, "layer": s.layer, "role": s.role, "std": s.std, "stated": s.stated,
                          "ratio": s.ratio, "rule": s.rule} for s in self.init], "gradients": self.grads.json()}
