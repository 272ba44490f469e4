"""Batch-coupled norms: BatchNorm, RepBN and the progressive LayerNorm → RepBN transition (PRepBN).

BatchNorm takes one mean and one biased variance per channel over every row of the batch
(the B and S axes), and in evaluation the running moments it tracked instead:

    BN(x)     = weight * (x - mean) / sqrt(var + eps) + bias
    RepBN(x)  = BN(x) + eta * x
    PRepBN(x) = gamma(t) * LN(x) + (1 - gamma(t)) * RepBN(x),   gamma(t) = clip((T - t) / T, 0, 1)

(Guo et al., "SLAB: Efficient Transformers with Simplified Linear Attention and Progressive
Re-parameterized Batch Normalization", arXiv:2405.11582.) The running moments follow
``torch.nn.BatchNorm1d``: an exponential average with weight ``momentum`` of the batch mean and
of the unbiased batch variance. With ``padding="mask"`` the rows a ``[B, S]`` keep-mask
(``attention_mask``: nonzero = a real token; in a boolean ``[B, H|1, Q, K]`` mask, a key no
query may attend) marks as padding neither enter the batch moments nor
update the running ones; their own outputs are still computed, from the valid rows' moments.

``calibrated_at`` (a buffer besides ``nn.BatchNorm1d``'s) records ``num_batches_tracked`` at the end
of the last calibration (-1: never): the running moments describe the current parameters only while
the two agree, and ``num_batches_tracked - calibrated_at`` is their age in batches.
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from blockir.lower.layers import numerics
from blockir.diagnostics import BlockError, Span, error

PADDING = ("mask", "include")


def valid_rows(x: Tensor, padding: str, mask: object, label: str, span: Span | None) -> Tensor | None:
    """The flat row selector of ``x`` ([rows] bool) under the padding policy, or None for every row."""
    if padding != "mask" or mask is None:
        return None
    span = span if span is not None else Span(label, 0, 0)
    if isinstance(mask, Tensor) and mask.dim() == 4 and mask.dtype == torch.bool and x.dim() == 3:
        # [B|1, H|1, Q|1, K] (True = may attend): a row is real when some query may attend to it
        mask = mask.any(dim=2).any(dim=1).expand(x.shape[0], -1)
    if not isinstance(mask, Tensor) or mask.dim() != 2 or tuple(mask.shape) != tuple(x.shape[:2]) or x.dim() != 3:
        shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise BlockError([error(
            "E0750", f"{label} masks padded rows, but the attention_mask {shape} does not mark the rows of its "
            f"input {tuple(x.shape)}", span,
            hint="pass attention_mask as the tokenizer's [B, S] keep-mask (nonzero = a real token) or a boolean "
                 "[B, H|1, Q, K] mask (a key no query may attend is padding)")])
    keep = mask.reshape(-1) != 0
    if not bool(keep.any()):
        raise BlockError([error("E0750", f"{label} masks padded rows, but every row of the batch is padding: there "
                                "are no moments to take", span, hint="feed batches with at least one real token")])
    return keep


def batch_moments(x: Tensor, keep: Tensor | None) -> tuple[Tensor, Tensor, int]:
    """Per-channel mean and biased variance over the selected rows, and how many rows there were."""
    rows = x.reshape(-1, x.shape[-1])
    if keep is not None:
        rows = rows[keep]
    mean = rows.mean(0)
    return mean, (rows - mean).pow(2).mean(0), rows.shape[0]


class BatchNorm(nn.Module):
    """BatchNorm over the last axis (RepBN with ``rep=True``), its moments and map in ``accum``;
    state-dict names as ``nn.BatchNorm1d``."""

    def __init__(self, width: int, eps: float = 1e-5, momentum: float = 0.1, padding: str = "mask",
                 running: bool = True, affine: bool = True, rep: bool = False, eta: float = 1.0,
                 accum: torch.dtype = torch.float32, label: str = "batchnorm", span: Span | None = None) -> None:
        super().__init__()
        if padding not in PADDING:
            raise ValueError(f"unknown padding policy {padding!r}; expected one of {PADDING}")
        vars(self).update(width=width, eps=eps, momentum=momentum, padding=padding, accum=accum, label=label,
                          span=span)
        self.weight = nn.Parameter(torch.ones(width)) if affine else None
        self.bias = nn.Parameter(torch.zeros(width)) if affine else None
        self.eta = nn.Parameter(torch.full((1,), float(eta))) if rep else None
        self.running = running
        if running:
            self.register_buffer("running_mean", torch.zeros(width))
            self.register_buffer("running_var", torch.ones(width))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
            self.register_buffer("calibrated_at", torch.tensor(-1, dtype=torch.long))
        # calibration replaces the running average by the plain mean of every calibration batch
        self.cumulative = False

    def moments(self, x: Tensor, mask: object = None) -> tuple[Tensor, Tensor]:
        """The mean and variance this call normalizes with; updates the running moments when it should."""
        if not self.training and self.running:
            return self.running_mean.to(x.dtype), self.running_var.to(x.dtype)
        mean, var, n = batch_moments(x, valid_rows(x, self.padding, mask, self.label, self.span))
        if self.training and self.running:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = 1.0 / float(self.num_batches_tracked) if self.cumulative else self.momentum
                unbiased = var * (n / max(n - 1, 1))
                self.running_mean.mul_(1 - m).add_(m * mean.detach().to(self.running_mean.dtype))
                self.running_var.mul_(1 - m).add_(m * unbiased.detach().to(self.running_var.dtype))
        return mean, var

    blockir_context: ClassVar[frozenset[str]] = frozenset({"attention_mask"})  # the padded rows it leaves out

    def forward(self, x: Tensor, attention_mask: object = None, **_: Any) -> Tensor:
        work = x.to(self.accum)
        mean, var = self.moments(work, attention_mask)
        y = (work - mean) * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight.to(work.dtype) + self.bias.to(work.dtype)
        if self.eta is not None:
            y = y + self.eta.to(work.dtype) * work
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return (f"{self.width}, eps={self.eps}, momentum={self.momentum}, padding={self.padding}, "
                f"running={self.running}, rep={self.eta is not None}")


class PRepBN(nn.Module):
    """A LayerNorm ``ln`` and a RepBN ``bn`` mixed by ``gamma(step)``; ``step`` counts training calls."""

    def __init__(self, width: int, steps: int, eps: float = 1e-5, ln_eps: float = 1e-5, momentum: float = 0.1,
                 padding: str = "mask", running: bool = True, eta: float = 1.0, accum: torch.dtype = torch.float32,
                 label: str = "prepbn", span: Span | None = None) -> None:
        super().__init__()
        if steps < 1:
            raise ValueError(f"the transition needs at least one step, got {steps}")
        self.transition = steps
        self.ln = numerics.LayerNorm(width, ln_eps, accum=accum)
        self.bn = BatchNorm(width, eps, momentum, padding, running, rep=True, eta=eta, accum=accum, label=label,
                            span=span)
        self.register_buffer("step", torch.tensor(0, dtype=torch.long))

    def gamma(self) -> Tensor:
        """The LayerNorm share at the current step (a 0-d tensor, so no host sync in the graph)."""
        return ((self.transition - self.step) / self.transition).clamp(0.0, 1.0)

    blockir_context: ClassVar[frozenset[str]] = frozenset({"attention_mask"})  # its BatchNorm's padded rows

    def forward(self, x: Tensor, attention_mask: object = None, **_: Any) -> Tensor:
        g = self.gamma().to(x.dtype)
        y = g * self.ln(x) + (1 - g) * self.bn(x, attention_mask)
        if self.training and not self.bn.cumulative:
            self.step.add_(1)
        return y

    def extra_repr(self) -> str:
        return f"steps={self.transition}"
