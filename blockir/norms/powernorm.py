"""PowerNorm (Shen et al., "PowerNorm: Rethinking Batch Normalization in Transformers", ICML 2020).

A batch-coupled norm without recentering: each channel is divided by the root of a running
quadratic mean ψ² of that channel over every row of the batch (the B and S axes). Training uses
the relaxed forward of the paper's Algorithm 1, which normalizes by the running value of the
previous step, and its approximate backward, which stands in for the gradient through the
statistic with a running correction ν:

    forward   ψ²_B = mean over the batch's rows of x²
              x̂ = x / sqrt(ψ²_{t-1} + eps),  y = weight ⊙ x̂ + bias
              ψ²_t = (1 - momentum) ψ²_{t-1} + momentum ψ²_B
    backward  g = ∂L/∂x̂,  g' = g - ν_{t-1} ⊙ x̂,  ∂L/∂x = g' / sqrt(ψ²_{t-1} + eps)
              ν_t = ν_{t-1} (1 - momentum Γ) + momentum Λ,  Γ = mean(x̂²), Λ = mean(x̂ ⊙ g)
    inference y = weight ⊙ x / sqrt(ψ² + eps) + bias

``momentum`` is the paper's 1 - α (α = 0.9 there). With ``padding="mask"`` padded rows enter
neither ψ²_B nor Γ and Λ, and get no ν correction. ``running=false`` keeps no running state: every
call divides by its own batch's ψ²_B, and the gradient is the exact one. A calibration replaces
ψ² by the plain mean of the calibration batches' ψ²_B, each batch normalized by its own.
"""
from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any, Mapping

from blockir.ir.schema import ArgSpec
from blockir.norms import args as A
from blockir.norms import batchnorm as bn
from blockir.norms.base import NormFamily, Value, accum_dtype

if TYPE_CHECKING:
    from torch import Tensor

Shape = tuple[int, ...]


@cache
def _relaxed() -> Any:
    import torch

    class Relaxed(torch.autograd.Function):
        """y = weight ⊙ x · rstd + bias with the running rstd of the previous step, and the approximate backward.
        The affine is inside, so the backward (and ν's update) runs whenever anything the norm holds trains."""

        @staticmethod
        def forward(ctx: Any, x: Tensor, weight: Tensor | None, bias: Tensor | None,  # type: ignore[override]
                    rstd: Tensor, nu: Tensor, keep: Tensor | None, momentum: float) -> Tensor:
            z = x * rstd
            ctx.save_for_backward(z, rstd, keep, weight)
            ctx.nu, ctx.momentum = nu, momentum
            return z if weight is None else z * weight + bias

        @staticmethod
        def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
            z, rstd, keep, weight = ctx.saved_tensors
            nu, m = ctx.nu, ctx.momentum
            flat_z, flat_grad = z.reshape(-1, z.shape[-1]), grad.reshape(-1, grad.shape[-1])
            dw = db = None
            if weight is not None:
                dw, db = (flat_grad * flat_z).sum(0), flat_grad.sum(0)
            g = flat_grad if weight is None else flat_grad * weight  # dL/dx̂
            correction = nu.to(z.dtype) * flat_z  # ν of the previous step, before this step updates it
            if keep is not None:  # padded rows took no part in the statistic
                correction = correction * keep.unsqueeze(-1).to(z.dtype)
                flat_z, g_kept = flat_z[keep], g[keep]
            else:
                g_kept = g
            with torch.no_grad():
                gamma, lam = flat_z.pow(2).mean(0), (flat_z * g_kept).mean(0)
                nu.mul_(1 - m * gamma.to(nu.dtype)).add_(m * lam.to(nu.dtype))
            return ((g - correction) * rstd).reshape(grad.shape), dw, db, None, None, None, None
    return Relaxed


class PowerNorm(NormFamily):
    name = "powernorm"
    doc = ("PowerNorm: per-channel running quadratic mean over every row (B, S), no centering, the relaxed "
           "forward and approximate backward in training")
    args = (*bn.STATS, ArgSpec("affine", "bool", True), A.TIED)
    rank = 80
    module_name = "PowerNorm"
    statistics, reductions = 0, (1, 2)
    batch_coupled = True
    context = bn.CONTEXT

    def bias(self, decl: Any) -> bool:
        return self.weight(decl)

    def keys(self, decl: Any, shape: Shape) -> list[tuple[str, Shape]]:
        return bn.parameters(decl, shape, False)

    def buffers(self, decl: Any, shape: Shape) -> list[tuple[str, Shape]]:
        if not decl.arg("running"):
            return []
        return [("running_square", shape), ("running_nu", shape), ("num_batches_tracked", ()), ("calibrated_at", ())]

    def mismatch(self, owner: str, extra: list[str], lost: list[str]) -> str | None:
        if f"{owner}.running_square" in lost and f"{owner}.running_var" in extra:
            return f"'{owner}' is a PowerNorm (a running quadratic mean), but the checkpoint has " \
                   f"'{owner}.running_var', a BatchNorm's variance"
        return None

    def manifest(self, decl: Any, value: Value) -> dict[str, Any]:
        return bn.stats_manifest(decl, value, False)

    def settings(self, decl: Any, value: Value) -> dict[str, Any]:
        return dict(eps=value(decl.arg("eps")), momentum=float(value(decl.arg("momentum"))), padding=decl.arg("padding"),
                    running=decl.arg("running"), affine=self.weight(decl), accum=accum_dtype(decl.arg("accum")),
                    label=f"{self.name} '{decl.name}'", span=decl.span)

    def state(self, module: Any, width: int) -> None:
        import torch
        if module.padding not in bn.PADDING:
            raise ValueError(f"unknown padding policy {module.padding!r}; expected one of {bn.PADDING}")
        module.parameter("weight", torch.ones(width) if module.affine else None)
        module.parameter("bias", torch.zeros(width) if module.affine else None)
        if module.running:
            module.register_buffer("running_square", torch.ones(width))
            module.register_buffer("running_nu", torch.zeros(width))
            module.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
            module.register_buffer("calibrated_at", torch.tensor(-1, dtype=torch.long))
        module.cumulative = False

    def forward(self, module: Any, x: Any, mask: object) -> Any:
        import torch
        work = x.to(module.accum)
        if not module.running or module.training:
            keep = bn.valid_rows(work, module.padding, mask, module.label, module.span)
            rows = work.reshape(-1, work.shape[-1])
            square = (rows if keep is None else rows[keep]).pow(2).mean(0)
        # no running state, or a calibration: each batch is normalized by its own quadratic mean
        own = not module.running or module.cumulative
        rstd = torch.rsqrt((square if own else module.running_square.to(work.dtype)) + module.eps)
        affine = (None, None) if module.weight is None else (module.weight.to(work.dtype), module.bias.to(work.dtype))
        if module.training and not own and torch.is_grad_enabled():
            y = _relaxed().apply(work, *affine, rstd, module.running_nu, keep, module.momentum)
        else:
            z = work * rstd
            y = z if affine[0] is None else z * affine[0] + affine[1]
        if module.running and module.training:
            with torch.no_grad():
                module.num_batches_tracked.add_(1)
                r = 1.0 / float(module.num_batches_tracked) if module.cumulative else module.momentum
                module.running_square.mul_(1 - r).add_(r * square.detach().to(module.running_square.dtype))
        return y.to(x.dtype)

    def fixed_map(self, state: Mapping[str, Any], at: str, eps: float) -> tuple[Any, Any]:
        import torch
        square = state[at + "running_square"]
        gain = state.get(at + "weight", torch.ones_like(square))
        return gain * torch.rsqrt(square + eps), state.get(at + "bias", torch.zeros_like(square))

    def running(self, module: Any) -> Any:
        return module if module.running else None

    def reset(self, module: Any) -> None:
        module.running_square.fill_(1.0)
        module.num_batches_tracked.zero_()

    def describe(self, module: Any) -> str:
        return (f"{module.width}, eps={module.eps}, momentum={module.momentum}, padding={module.padding}, "
                f"running={module.running}")

    def declared(self, module: Any) -> str:
        return f"{bn.stats_declared(vars(module))}, affine={'true' if module.affine else 'false'}"


FAMILY = PowerNorm()
