"""Progressive LayerNorm -> RepBN (PRepBN; Guo et al., arXiv:2405.11582).

    PRepBN(x) = gamma(t) * LN(x) + (1 - gamma(t)) * RepBN(x),   gamma(t) = clip((T - t) / T, 0, 1)

The module holds a LayerNorm ``ln`` and a RepBN ``bn`` (see ``blockir.norms.batchnorm``) and a
``step`` buffer that counts training calls; calibration does not advance it.
"""
from __future__ import annotations

from typing import Any, Mapping

from blockir.ir.consts import Num
from blockir.ir.schema import ArgSpec
from blockir.norms import args as A
from blockir.norms import batchnorm as bn
from blockir.norms import layernorm as ln
from blockir.norms.base import NormFamily, Value, accum_dtype, number

Shape = tuple[int, ...]


class PRepBN(NormFamily):
    name = "prepbn"
    doc = "progressive LayerNorm -> RepBN: gamma(t) * LN(x) + (1 - gamma(t)) * (BN(x) + eta * x)"
    args = (*bn.STATS, ArgSpec("steps", "expr", doc="transition steps T: gamma = clip((T - t) / T, 0, 1)"),
            ArgSpec("ln_eps", "expr", Num(1e-5), doc="eps of the LayerNorm share"),
            ArgSpec("eta", "expr", Num(1.0), doc="initial eta of the RepBN share"), A.TIED)
    rank = 70
    module_name = "PRepBN"
    statistics, reductions = 2, (4, 4)
    batch_coupled = True
    context = bn.CONTEXT
    transitions = True
    statistics_prefix = "bn."
    statistics_note = "its RepBN share (the transition must be complete), "

    def weight(self, decl: Any) -> bool:
        return True

    def bias(self, decl: Any) -> bool:
        return True

    def centers(self, decl: Any) -> bool:
        return True

    def keys(self, decl: Any, shape: Shape) -> list[tuple[str, Shape]]:
        return [("ln.weight", shape), ("ln.bias", shape), *bn.parameters(decl, shape, True, "bn.")]

    def buffers(self, decl: Any, shape: Shape) -> list[tuple[str, Shape]]:
        return [*bn.buffers(decl, shape, "bn."), ("step", ())]

    def manifest(self, decl: Any, value: Value) -> dict[str, Any]:
        out = bn.stats_manifest(decl, value, True)
        steps = value(decl.arg("steps"))
        out["batch_stats"]["transition_steps"] = float(steps) if isinstance(steps, float) else steps
        return out

    def settings(self, decl: Any, value: Value) -> dict[str, Any]:
        accum = accum_dtype(decl.arg("accum"))
        layer = dict(eps=value(decl.arg("ln_eps")), accum=accum, offset=0, two_pass=False, recenter=False,
                     upcast=False, keys={}, affine=True, shift=True)
        batch = dict(eps=value(decl.arg("eps")), momentum=float(value(decl.arg("momentum"))),
                     padding=decl.arg("padding"), running=decl.arg("running"), affine=True, rep=True,
                     eta_init=float(value(decl.arg("eta"))), accum=accum, label=f"{self.name} '{decl.name}'",
                     span=decl.span)
        return dict(transition=int(value(decl.arg("steps"))), ln_settings=layer, bn_settings=batch)

    def state(self, module: Any, width: int) -> None:
        import torch
        if module.transition < 1:
            raise ValueError(f"the transition needs at least one step, got {module.transition}")
        module.child("ln", ln.FAMILY, module.ln_settings)
        module.child("bn", bn.FAMILY, module.bn_settings)
        module.register_buffer("step", torch.tensor(0, dtype=torch.long))

    @staticmethod
    def gamma(module: Any) -> Any:
        """The LayerNorm share at the current step (a 0-d tensor, so no host sync in the graph)."""
        return ((module.transition - module.step) / module.transition).clamp(0.0, 1.0)

    def forward(self, module: Any, x: Any, mask: object) -> Any:
        g = self.gamma(module).to(x.dtype)
        y = g * module.ln(x) + (1 - g) * module.bn(x, mask)
        if module.training and not module.bn.cumulative:
            module.step.add_(1)
        return y

    def fixed_map(self, state: Mapping[str, Any], at: str, eps: float) -> tuple[Any, Any]:
        return bn.FAMILY.fixed_map(state, at, eps)  # its RepBN share, once the transition is complete

    def running(self, module: Any) -> Any:
        return module.bn if module.bn.running else None

    def progress(self, module: Any) -> tuple[int, int, float] | None:
        return int(module.step), module.transition, float(self.gamma(module))

    def describe(self, module: Any) -> str:
        return f"steps={module.transition}"

    def declared(self, module: Any) -> str:
        b = module.bn_settings
        return (f"{bn.stats_declared(b)}, steps={module.transition}, ln_eps={number(module.ln_settings['eps'])}, "
                f"eta={number(b['eta_init'])}")


FAMILY = PRepBN()
