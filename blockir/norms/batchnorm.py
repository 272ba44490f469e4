"""BatchNorm and RepBN: per-channel moments over every row of the batch (the B and S axes).

    BN(x)    = weight * (x - mean) / sqrt(var + eps) + bias
    RepBN(x) = BN(x) + eta * x

In evaluation the running moments tracked in training replace the batch's own. They follow
``torch.nn.BatchNorm1d``: an exponential average with weight ``momentum`` of the batch mean and of
the unbiased batch variance. With ``padding="mask"`` the rows a ``[B, S]`` keep-mask
(``attention_mask``: nonzero = a real token; in a boolean ``[B, H|1, Q, K]`` mask, a key no query
may attend) marks as padding neither enter the batch moments nor update the running ones; their
own outputs are still computed, from the valid rows' moments. (Guo et al., "SLAB: Efficient
Transformers with Simplified Linear Attention and Progressive Re-parameterized Batch
Normalization", arXiv:2405.11582.)

``calibrated_at`` (a buffer besides ``nn.BatchNorm1d``'s) records ``num_batches_tracked`` at the end
of the last calibration (-1: never): the running moments describe the current parameters only while
the two agree, and ``num_batches_tracked - calibrated_at`` is their age in batches.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from blockir.diagnostics import BlockError, Span, error
from blockir.ir.consts import Num
from blockir.ir.schema import ArgSpec
from blockir.norms import args as A
from blockir.norms.base import NormFamily, Value, accum_dtype, accum_name, number

if TYPE_CHECKING:
    from torch import Tensor

Shape = tuple[int, ...]
PADDING = ("mask", "include")
# what every batch-coupled family declares: the channel axis, the moments' eps and momentum, padding, running
STATS = (
    A.axes("the channel axis: one mean and variance per channel"), A.eps(1e-5),
    ArgSpec("momentum", "expr", Num(0.1), doc="running = (1 - momentum) * running + momentum * batch"),
    A.PADDING, ArgSpec("running", "bool", True, doc="false: evaluation also uses the batch moments (no running state)"),
    A.ACCUM,
)
CONTEXT = frozenset({"attention_mask"})  # the keyword whose padded rows a batch-coupled norm leaves out


def valid_rows(x: Tensor, padding: str, mask: object, label: str, span: Span | None) -> Tensor | None:
    """The flat row selector of ``x`` ([rows] bool) under the padding policy, or None for every row."""
    import torch
    if padding != "mask" or mask is None:
        return None
    span = span if span is not None else Span(label, 0, 0)
    if isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.dtype == torch.bool and x.dim() == 3:
        # [B|1, H|1, Q|1, K] (True = may attend): a row is real when some query may attend to it
        mask = mask.any(dim=2).any(dim=1).expand(x.shape[0], -1)
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or tuple(mask.shape) != tuple(x.shape[:2]) \
            or x.dim() != 3:
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
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


def moments(m: Any, x: Tensor, mask: object = None) -> tuple[Tensor, Tensor]:
    """The mean and variance module ``m`` normalizes with; updates its running moments when it should."""
    import torch
    if not m.training and m.running:
        return m.running_mean.to(x.dtype), m.running_var.to(x.dtype)
    mean, var, n = batch_moments(x, valid_rows(x, m.padding, mask, m.label, m.span))
    if m.training and m.running:
        with torch.no_grad():
            m.num_batches_tracked.add_(1)
            # calibration replaces the running average by the plain mean of every calibration batch
            r = 1.0 / float(m.num_batches_tracked) if m.cumulative else m.momentum
            unbiased = var * (n / max(n - 1, 1))
            m.running_mean.mul_(1 - r).add_(r * mean.detach().to(m.running_mean.dtype))
            m.running_var.mul_(1 - r).add_(r * unbiased.detach().to(m.running_var.dtype))
    return mean, var


def stats_declared(settings: Mapping[str, Any]) -> str:
    """The arguments of ``STATS`` as a compiled module's settings hold them."""
    padding = f", padding={settings['padding']}" if settings["padding"] is not None else ""
    return (f"eps={number(settings['eps'])}, momentum={number(settings['momentum'])}{padding}, "
            f"running={'true' if settings['running'] else 'false'}, accum={accum_name(settings['accum'])}")


def parameters(decl: Any, shape: Shape, rep: bool, prefix: str = "") -> list[tuple[str, Shape]]:
    affine = [("weight", shape), ("bias", shape)] if decl.arg("affine") is not False else []
    return [(prefix + name, s) for name, s in affine + ([("eta", (1,))] if rep else [])]


def buffers(decl: Any, shape: Shape, prefix: str = "") -> list[tuple[str, Shape]]:
    if not decl.arg("running"):
        return []
    return [(prefix + "running_mean", shape), (prefix + "running_var", shape), (prefix + "num_batches_tracked", ()),
            (prefix + "calibrated_at", ())]


def stats_manifest(decl: Any, value: Value, rep: bool) -> dict[str, Any]:
    momentum = value(decl.arg("momentum"))
    return {"batch_stats": {"padding": decl.arg("padding"),
                            "momentum": float(momentum) if isinstance(momentum, float) else momentum,
                            "running": decl.arg("running"), "rep": rep}}


class BatchNorm(NormFamily):
    """BatchNorm over the last axis (RepBN with ``rep=true``), its moments and map in ``accum``; state-dict names
    as ``nn.BatchNorm1d``."""

    name = "batchnorm"
    doc = "BatchNorm: per-channel moments over every row (B, S), running moments for evaluation"
    args = (*STATS, ArgSpec("affine", "bool", True), ArgSpec("rep", "bool", False, doc="RepBN: add eta * x to the output"),
            ArgSpec("eta", "expr", Num(1.0), doc="initial eta of rep=true"), A.TIED)
    rank = 60
    module_name = "BatchNorm"
    statistics, reductions = 0, (2, 2)
    batch_coupled = True
    context = CONTEXT

    def bias(self, decl: Any) -> bool:
        return self.weight(decl)

    def centers(self, decl: Any) -> bool:
        return True

    def keys(self, decl: Any, shape: Shape) -> list[tuple[str, Shape]]:
        return parameters(decl, shape, bool(decl.arg("rep")))

    def buffers(self, decl: Any, shape: Shape) -> list[tuple[str, Shape]]:
        return buffers(decl, shape)

    def manifest(self, decl: Any, value: Value) -> dict[str, Any]:
        return stats_manifest(decl, value, bool(decl.arg("rep")))

    def settings(self, decl: Any, value: Value) -> dict[str, Any]:
        return dict(eps=value(decl.arg("eps")), momentum=float(value(decl.arg("momentum"))), padding=decl.arg("padding"),
                    running=decl.arg("running"), affine=self.weight(decl), rep=decl.arg("rep"),
                    eta_init=float(value(decl.arg("eta"))), accum=accum_dtype(decl.arg("accum")),
                    label=f"{self.name} '{decl.name}'", span=decl.span)

    def state(self, module: Any, width: int) -> None:
        import torch
        if module.padding not in PADDING:
            raise ValueError(f"unknown padding policy {module.padding!r}; expected one of {PADDING}")
        module.parameter("weight", torch.ones(width) if module.affine else None)
        module.parameter("bias", torch.zeros(width) if module.affine else None)
        module.parameter("eta", torch.full((1,), module.eta_init) if module.rep else None)
        if module.running:
            module.register_buffer("running_mean", torch.zeros(width))
            module.register_buffer("running_var", torch.ones(width))
            module.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
            module.register_buffer("calibrated_at", torch.tensor(-1, dtype=torch.long))
        module.cumulative = False

    def forward(self, module: Any, x: Any, mask: object) -> Any:
        import torch
        work = x.to(module.accum)
        mean, var = moments(module, work, mask)
        y = (work - mean) * torch.rsqrt(var + module.eps)
        if module.weight is not None:
            y = y * module.weight.to(work.dtype) + module.bias.to(work.dtype)
        if module.eta is not None:
            y = y + module.eta.to(work.dtype) * work
        return y.to(x.dtype)

    def fixed_map(self, state: Mapping[str, Any], at: str, eps: float) -> tuple[Any, Any]:
        import torch
        mean, var = state[at + "running_mean"], state[at + "running_var"]
        rstd = torch.rsqrt(var + eps)
        gain, shift = state.get(at + "weight", torch.ones_like(var)), state.get(at + "bias", torch.zeros_like(var))
        return gain * rstd + state.get(at + "eta", 0.0), shift - gain * rstd * mean

    def running(self, module: Any) -> Any:
        return module if module.running else None

    def declared(self, module: Any) -> str:
        return (f"{stats_declared(vars(module))}, affine={'true' if module.affine else 'false'}, "
                f"rep={'true' if module.rep else 'false'}, eta={number(module.eta_init)}")

    def reset(self, module: Any) -> None:
        module.running_mean.zero_()
        module.running_var.fill_(1.0)
        module.num_batches_tracked.zero_()

    def describe(self, module: Any) -> str:
        return (f"{module.width}, eps={module.eps}, momentum={module.momentum}, padding={module.padding}, "
                f"running={module.running}, rep={module.eta is not None}")


FAMILY = BatchNorm()
