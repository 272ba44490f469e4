"""LayerNorm (Ba et al., 2016): biased variance, ``eps`` inside the square root, a gain and a shift.

With fp32 statistics on an fp32/bf16/fp16 input the forward is exactly the ATen kernel behind
``nn.LayerNorm``, so checkpoints trained with it are reproduced bit for bit. Any other
accumulation dtype, or ``two_pass``, is spelled out: ``x`` in ``accum``, its mean, the mean of
the squared deviations, ``(x - mean) * rsqrt(var + eps)``, the affine in ``accum``, one cast back
at the end — bit for bit what code written that way computes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blockir.diagnostics import error
from blockir.ir.schema import ArgSpec, Implies
from blockir.norms import args as A
from blockir.norms.base import NormFamily, Value, accum_dtype, offset_weight
from blockir.norms.sharded_rows import feature_axis, like, own_features, whole_row_sums

if TYPE_CHECKING:
    from torch import Tensor

    from blockir.diagnostics import Diagnostic
    from blockir.ir.decls import KindDecl

def layer_norm(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    accum: Any = None,
    offset: int = 0,
    two_pass: bool = False,
    recenter: bool = False,
    upcast: bool = False,
) -> Tensor:
    """LayerNorm over the last axis. ``offset=1`` scales by ``1 + weight``, the one added in the weight's own
    dtype before the kernel runs (Megatron's LayerNorm1P); ``recenter`` subtracts the mean a second time for
    the output (autograd then sums the input's gradient over both); ``upcast`` runs the kernel on a copy in
    ``accum`` and casts the result back (OLMo's ``F.layer_norm(x.float())``)."""
    import torch
    import torch.nn.functional as F
    accum = torch.float32 if accum is None else accum
    if weight is not None:
        weight = offset_weight(weight, offset)
    if feature_axis(x) is not None:
        return _feature_sharded_layer_norm(x, weight, bias, eps, accum)
    if upcast and not two_pass:
        cast = (lambda t: t.to(accum) if t is not None else None)
        return F.layer_norm(x.to(accum), (x.shape[-1],), cast(weight), cast(bias), eps).to(x.dtype)
    # the input dtypes the ATen kernel takes with fp32 statistics
    if not two_pass and accum == torch.float32 and x.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    work = x.to(accum)
    mean = work.mean(-1, keepdim=True)
    centered = work - mean
    variance = centered.pow(2).mean(-1, keepdim=True)
    # a second subtraction holds the same values, but autograd sums the input's gradient over both nodes
    y = (work - mean if recenter else centered) * torch.rsqrt(variance + eps)
    if weight is not None:
        y = y * weight.to(accum)
    if bias is not None:
        y = y + bias.to(accum)
    return y.to(x.dtype)


def _feature_sharded_layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
                                accum: Any) -> Tensor:
    """LayerNorm of rows whose features are split over ranks, the output split the same way.

    Each rank sums its slice of every row, Σx and Σx², and one all-reduce of those two numbers per row gives
    the row's mean and biased variance (E[x²] − mean²); the affine parameters are sliced to the rank's
    features (``sharded_rows``). The whole row is never gathered, so a Post-LN stream stays feature-sharded.
    The single pass replaces ``two_pass`` here: its answer differs from the one-device kernel by rounding only.
    """
    import torch
    local = x.to_local().to(accum)  # type: ignore[attr-defined]
    sums = whole_row_sums(x, torch.stack((local.sum(-1), local.pow(2).sum(-1)), dim=-1))
    mean = sums[..., :1] / x.shape[-1]
    variance = (sums[..., 1:] / x.shape[-1] - mean * mean).clamp_min(0)
    y = (local - mean) * torch.rsqrt(variance + eps)
    for p, combine in ((weight, torch.mul), (bias, torch.add)):
        if p is not None:
            y = combine(y, own_features(x, p).to(accum))
    return like(x, y.to(x.dtype))


class LayerNorm(NormFamily):
    name = "layernorm"
    doc = "LayerNorm: biased variance, eps inside the square root"
    args = (
        A.axes(), A.eps(1e-5),
        ArgSpec("bias", "bool", True), ArgSpec("affine", "bool", True), ArgSpec("center", "bool", True),
        A.ACCUM, A.offset("weight"), A.TIED, A.MOMENTS, A.AFFINE_GRAD,
        ArgSpec("two_pass", "bool", None, doc="true: mean, then variance, and the affine all in accum, one "
                "cast at the end (code written that way); unset: the LayerNorm kernel"), A.GAIN_NAME, A.SHIFT_NAME,
        ArgSpec("recenter", "bool", None, doc="with two_pass=true: x - mean is computed twice, once for the variance "
                "and once for the output, as code written that way (Cohere) does; autograd then sums the input's "
                "gradient over both"),
        ArgSpec("upcast", "bool", None, doc="true: the LayerNorm kernel runs on a copy of the input (and of the "
                "weight and bias) in accum, and the result is cast back (OLMo's F.layer_norm(x.float()))"))
    implies: tuple[Implies, ...] = (A.NO_AFFINE_BIAS, A.NO_AFFINE_OFFSET)
    rank = 10
    module_name = "LayerNorm"
    statistics, reductions = 2, (2, 2)
    fused_code = "layer"
    qk_norm = 2
    unaffine = {"affine": False, "bias": False, "offset": 0}
    math = staticmethod(layer_norm)

    def weight(self, decl: Any) -> bool:
        return bool(decl.arg("affine"))

    def sharded_backward(self, decl: Any) -> str:
        return "row_sums"  # _feature_sharded_layer_norm

    def bias(self, decl: Any) -> bool:
        return self.weight(decl) and bool(decl.arg("bias"))

    def centers(self, decl: Any) -> bool:
        return bool(decl.arg("center"))

    def contract(self, decl: KindDecl) -> Diagnostic | None:
        if decl.arg("center") is False:
            return error("E0305", f"layernorm '{decl.name}' has center=false: without centering it divides by the "
                         "RMS, which is an RMSNorm", decl.span, hint=f"declare it as rmsnorm("
                         f"{', '.join(decl.arg('axes'))}, eps=…); LayerNorm and RMSNorm checkpoints are not "
                         "interchangeable")
        return None

    def mismatch(self, owner: str, extra: list[str], lost: list[str]) -> str | None:
        if f"{owner}.bias" in lost and f"{owner}.weight" not in lost:
            return f"'{owner}' is a LayerNorm with a bias, but the checkpoint has only its weight (an RMSNorm or " \
                   "bias-free checkpoint)"
        return None

    def settings(self, decl: Any, value: Value) -> dict[str, Any]:
        return dict(eps=value(decl.arg("eps")), accum=accum_dtype(decl.arg("accum")), offset=decl.arg("offset", 0),
                    two_pass=bool(decl.arg("two_pass")), recenter=bool(decl.arg("recenter")),
                    upcast=bool(decl.arg("upcast")), keys=self.names(decl), affine=self.weight(decl),
                    shift=self.bias(decl))

    def state(self, module: Any, width: int) -> None:
        import torch
        # the zero init for offset=1 keeps the initial scale at one
        module.parameter("weight", torch.full((width,), 1.0 - module.offset) if module.affine else None)
        module.parameter("bias", torch.zeros(width) if module.shift else None)

    def arguments(self, module: Any, x: Any) -> tuple[Any, ...]:
        return (module.met("weight", x), module.met("bias", x), module.eps, module.accum, module.offset,
                module.two_pass, module.recenter, module.upcast)

    def describe(self, module: Any) -> str:
        return (f"{module.width}, eps={module.eps}, bias={module.shift}, affine={module.affine}, "
                f"accum={module.accum}, offset={module.offset}, two_pass={module.two_pass}")


FAMILY = LayerNorm()
