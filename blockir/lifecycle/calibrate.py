"""Calibration of batch-coupled norms, and the state a run reports about them.

Calibration freezes everything else and recomputes each BatchNorm's running moments on data:
the moments are reset, every calibration batch is normalized by its own moments (as in
training, so the layers after a norm see what they saw there), and the running moments become
the plain average over the batches (``nn.BatchNorm1d`` with ``momentum=None``). Dropout and
stochastic depth are off, and a PRepBN's transition step does not advance. Afterwards
``calibrated_at`` equals ``num_batches_tracked``, which is what the fixed-statistics fold checks
(Guo et al., arXiv:2405.11582: after training, refresh the statistics, then fold).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from blockir.lower.layers.norm_module import Norm
from blockir.diagnostics import BlockError, Span, argument_error, error
from blockir.signatures import public

HERE = Span("blockir.calibrate", 0, 0)


@dataclass(frozen=True)
class NormState:
    """Where one batch-coupled norm stands: its transition and the age of its running moments."""

    name: str
    step: int | None  # PRepBN: training calls so far
    transition: int | None  # PRepBN: T
    gamma: float | None  # PRepBN: the LayerNorm share now
    tracked: int  # batches the running moments have seen
    calibrated_at: int  # tracked at the last calibration; -1: never

    @property
    def age(self) -> int:
        """Batches the running moments were updated by training since the last calibration."""
        return self.tracked - self.calibrated_at if self.calibrated_at >= 0 else self.tracked

    def line(self) -> str:
        head = f"{self.name:<28}"
        if self.transition is not None:
            head += f"step {self.step}/{self.transition}  gamma {self.gamma:.4f}  "
        when = "never calibrated" if self.calibrated_at < 0 else f"calibrated at batch {self.calibrated_at}"
        return head + f"running-stat age {self.age} batches ({when})"


def batch_norms(module: nn.Module) -> list[tuple[str, Norm]]:
    """Every norm of ``module`` with running moments, by path: the outermost one (a PRepBN, not its RepBN)."""
    inside = {id(c) for m in module.modules() if isinstance(m, Norm) for c in m.children()}
    return [(name, m) for name, m in module.named_modules()
            if isinstance(m, Norm) and id(m) not in inside and m.family.running(m) is not None]


def norm_states(module: nn.Module) -> list[NormState]:
    out = []
    for name, m in batch_norms(module):
        bn = m.family.running(m)
        step, transition, gamma = m.family.progress(m) or (None, None, None)
        out.append(NormState(name, step, transition, gamma, int(bn.num_batches_tracked), int(bn.calibrated_at)))
    return out


@public("calibrate")
def calibrate(module: nn.Module, batches: Iterable[Any], **ctx: Any) -> list[NormState]:
    """Recompute the running moments of every batch-coupled norm in ``module`` from ``batches``.

    Each batch is a tensor or a tuple of the module's inputs; ``ctx`` (an ``attention_mask``, …)
    is passed to every call. Returns the norms' states afterwards.
    """
    if not isinstance(module, nn.Module):
        raise BlockError([argument_error("calibrate", "module", f"expected a compiled module, got "
                                         f"{type(module).__name__}")])
    norms = [m.family.running(m) for _, m in batch_norms(module)]
    if not norms:
        raise BlockError([error("E0753", "nothing to calibrate: the module has no batchnorm or prepbn with running "
                                "moments", HERE, hint="calibration refreshes running moments; declare running=true")])
    modes = {m: m.training for m in module.modules()}
    seen = 0
    try:
        module.eval()
        with torch.no_grad():
            for bn in norms:
                bn.family.reset(bn)
                bn.cumulative = True
                bn.train()
            for batch in batches:
                inputs = batch if isinstance(batch, tuple) else (batch,)
                if not all(isinstance(x, Tensor) for x in inputs):
                    raise BlockError([argument_error("calibrate", "batches", "each batch must be a tensor or a "
                                                     "tuple of tensors")])
                module(*inputs, **ctx)
                seen += 1
        if seen == 0:
            raise BlockError([error("E0753", "no calibration batches: the running moments would be left reset",
                                    HERE, hint="pass at least one batch (blockir calibrate --steps N, N >= 1)")])
        for bn in norms:
            bn.calibrated_at.copy_(bn.num_batches_tracked)
    finally:
        for bn in norms:
            bn.cumulative = False
        for m, training in modes.items():
            m.training = training
    return norm_states(module)
