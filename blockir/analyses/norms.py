"""The norm-family table: what each norm family owns, computes and costs, stated once.

Keys, the cost ledger, the manifest, the fusion pass and the module factory
all read a norm declaration through its family's entry here, so they agree
on which parameters exist (and under which keys), on the affine defaults,
and on how many row statistics and reductions one application takes.

=========  ======================  =========================  ==========  =============
family     parameters (keys)       affine default             statistics  reductions
=========  ======================  =========================  ==========  =============
layernorm  weight, bias            affine=true, bias=true     mean, rstd  2 fwd, 2 bwd
rmsnorm    weight                  affine unless false        rstd        1 fwd, 1 bwd
scalenorm  scale (one scalar)      always                     row norm    1 fwd, 1 bwd
dyt        alpha, weight, bias     always                     none        elementwise
l2norm     none                    never                      row norm    1 fwd, 1 bwd
batchnorm  weight, bias (+ eta)    affine=true                per channel 2 fwd, 2 bwd
prepbn     ln.*, bn.* (+ step)     always                     mean, rstd  4 fwd, 4 bwd
=========  ======================  =========================  ==========  =============

BatchNorm and PRepBN are batch-coupled: their moments are per channel over every
row, so they also own buffers (``running_mean``, ``running_var``,
``num_batches_tracked``, ``calibrated_at`` and PRepBN's transition ``step``) that travel in the
state dict but are not parameters. RepBN (``rep=true``) adds ``eta * x``
(Guo et al., 2024, arXiv:2405.11582); PRepBN holds a LayerNorm ``ln`` and a
RepBN ``bn`` and mixes them by its transition schedule.

A declaration may store its gain and shift under a checkpoint's own names
(``weight_name=g``, ``bias_name=beta``; ScaleNorm's ``weight_name`` renames
``scale``): every reader takes the key from ``keys``/``names`` here.

Every family may store its gain as a deviation from one (``offset=1``: the
scale is ``1 + weight``, or ``1 + scale`` for ScaleNorm); the keys are the
same, and the fused kernels implement the offset for RMSNorm only.

(Ba et al., 2016; Zhang and Sennrich, 2019; Nguyen and Salazar, 2019; Zhu et al., 2025.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from blockir.ir.decls import KindDecl

Shape = tuple[int, ...]


@dataclass(frozen=True)
class NormFamily:
    name: str
    module: str  # the numerics class the backends build
    statistics: int  # row statistics saved for backward
    reductions: tuple[int, int]  # row reductions per application: forward, backward
    fusable: bool  # the fused add+norm kernels implement it
    _weight: Callable[[KindDecl], bool]
    _bias: Callable[[KindDecl], bool]
    _scale: str  # per_channel | scalar | none (when not affine)
    _extra: tuple[tuple[str, Shape], ...] = ()  # parameters of fixed shape, before weight and bias
    _fused_offset: bool = False  # the fused kernels implement a (1 + weight) gain
    _layout: Callable[[KindDecl, Shape], list[tuple[str, Shape]]] | None = None  # replaces the rule below
    _buffers: Callable[[KindDecl, Shape], list[tuple[str, Shape]]] = lambda d, shape: []
    batch_coupled: bool = False  # moments over rows: a padding policy and running state matter

    def buffers(self, decl: KindDecl, shape: Shape) -> list[tuple[str, Shape]]:
        """(key suffix, shape) of every buffer the state dict carries besides the parameters."""
        return self._buffers(decl, shape)

    def fuses(self, decl: KindDecl) -> bool:
        """Whether the fused add+norm kernels reproduce this declaration exactly."""
        return self.fusable and (self._fused_offset or not decl.arg("offset", 0))

    def weight(self, decl: KindDecl) -> bool:
        """Whether the norm learns a gain (per channel, or ScaleNorm's one scalar)."""
        return self._weight(decl)

    def bias(self, decl: KindDecl) -> bool:
        """Whether the norm learns a shift."""
        return self.weight(decl) and self._bias(decl)

    def scale(self, decl: KindDecl) -> str:
        return self._scale if self.weight(decl) else "none"

    def affine_keys(self, decl: KindDecl) -> tuple[str, ...]:
        """Key suffixes of the gain and shift applied after normalizing: what a scale or a linear can absorb
        (DyT's ``alpha`` sits inside the tanh and is not among them)."""
        extra = {name for name, _ in self._extra}
        return tuple(name for name, _ in self.keys(decl, ()) if name not in extra)

    def names(self, decl: KindDecl) -> dict[str, str]:
        """Role -> key for the parameters the declaration names itself (``weight_name=g``): the gain is
        ``weight`` (ScaleNorm's ``scale``) and the shift ``bias`` unless renamed."""
        gain = "scale" if self._scale == "scalar" else "weight"
        given = {gain: decl.arg("weight_name"), "bias": decl.arg("bias_name")}
        return {role: key for role, key in given.items() if key}

    def keys(self, decl: KindDecl, shape: Shape) -> list[tuple[str, Shape]]:
        """(key suffix, shape) of every parameter, in the order the module registers them."""
        names = self.names(decl)
        if self._layout is not None:
            return self._layout(decl, shape)
        if self._scale == "scalar":
            return [(names.get("scale", "scale"), ())]
        out = list(self._extra)
        if self.weight(decl):
            out.append((names.get("weight", "weight"), shape))
        if self.bias(decl):
            out.append((names.get("bias", "bias"), shape))
        return out

    def parameters(self, decl: KindDecl, width: int) -> int:
        """Parameter elements of one declaration over a width-``width`` axis."""
        return sum(_numel(shape) for _, shape in self.keys(decl, (width,)))


def _numel(shape: Shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _bn_parameters(decl: KindDecl, shape: Shape, prefix: str = "") -> list[tuple[str, Shape]]:
    affine = [("weight", shape), ("bias", shape)] if decl.arg("affine") is not False else []
    rep = [("eta", (1,))] if decl.kind == "prepbn" or decl.arg("rep") else []
    return [(prefix + name, s) for name, s in affine + rep]


def _bn_buffers(decl: KindDecl, shape: Shape, prefix: str = "") -> list[tuple[str, Shape]]:
    if not decl.arg("running"):
        return []
    return [(prefix + "running_mean", shape), (prefix + "running_var", shape), (prefix + "num_batches_tracked", ()),
            (prefix + "calibrated_at", ())]


FAMILIES: dict[str, NormFamily] = {f.name: f for f in (
    NormFamily("layernorm", "LayerNorm", 2, (2, 2), True, lambda d: bool(d.arg("affine")),
               lambda d: bool(d.arg("bias")), "per_channel"),
    # an unset affine means the usual per-channel weight; only an affine fold writes affine=false
    NormFamily("rmsnorm", "RMSNorm", 1, (1, 1), True, lambda d: d.arg("affine") is not False,
               lambda d: False, "per_channel", _fused_offset=True),
    NormFamily("scalenorm", "ScaleNorm", 1, (1, 1), False, lambda d: True, lambda d: False, "scalar"),
    NormFamily("dyt", "DyT", 0, (0, 0), False, lambda d: True, lambda d: True, "per_channel",
               (("alpha", (1,)),)),
    # F.normalize: the row over its clamped L2 norm, nothing learned (nGPT, QK-norm)
    NormFamily("l2norm", "L2Norm", 1, (1, 1), False, lambda d: False, lambda d: False, "none"),
    NormFamily("batchnorm", "BatchNorm", 0, (2, 2), False, lambda d: d.arg("affine") is not False,
               lambda d: True, "per_channel", _layout=_bn_parameters, _buffers=_bn_buffers, batch_coupled=True),
    NormFamily("prepbn", "PRepBN", 2, (4, 4), False, lambda d: True, lambda d: True, "per_channel",
               _layout=lambda d, shape: [("ln.weight", shape), ("ln.bias", shape), *_bn_parameters(d, shape, "bn.")],
               _buffers=lambda d, shape: [*_bn_buffers(d, shape, "bn."), ("step", ())], batch_coupled=True),
)}


def family(decl: KindDecl) -> NormFamily:
    """The family entry of a norm declaration."""
    return FAMILIES[decl.kind]


# Dynamic Tanh's alpha initialisation for LLaMA models (Zhu et al., arXiv:2503.10622): one value for the norm
# in front of attention, another for every other site, by width. Rows: (largest width, attention, other);
# the table has only 4096 (7B), 5120 (13B) and 8192 (34B, 70B), so narrower widths take the first row.
DYT_LLM_ALPHA = ((4096, 0.8, 0.2), (5120, 0.6, 0.15), (None, 0.2, 0.05))
DYT_GENERIC_ALPHA = 0.5  # the paper's default for non-LLM models, at every site


def dyt_llm_alpha(width: int) -> tuple[float, float]:
    """(attention-site alpha, other-site alpha) for a model of width ``width``."""
    return next((a, o) for top, a, o in DYT_LLM_ALPHA if top is None or width <= top)

