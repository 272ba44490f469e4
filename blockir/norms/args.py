"""Arguments several norm families declare alike."""
from __future__ import annotations

from blockir.ir.consts import Num
from blockir.ir.schema import ArgSpec, Implies

TIED = ArgSpec("tied", "bool", False, doc="this instance is deliberately applied at several sites")
ACCUM = ArgSpec("accum", "dtype", "f32", doc="dtype of the row statistics")
# Runtime ownership of a norm under a device mesh; unset means the mathematical norm (global row
# moments, affine gradients summed over the ranks that own rows), which is what every file without
# a layout means.
MOMENTS = ArgSpec("moments", "enum", None, choices=("global", "local"),
                  doc="local: statistics of the rank's own slice of the row only")
AFFINE_GRAD = ArgSpec("affine_grad", "enum", None, choices=("sum", "local"),
                      doc="local: each rank keeps the affine gradient of its own rows")
PADDING = ArgSpec("padding", "enum", None, choices=("mask", "include"),
                  doc="mask: rows the attention_mask marks as padding neither enter the batch moments nor update the "
                      "running ones; include: every row does")
NO_AFFINE_OFFSET = Implies("affine", False, "offset", 0,
                           "offset=1 scales by (1 + weight); affine=false has no weight")
NO_AFFINE_BIAS = Implies("affine", False, "bias", False, "the bias is affine state: affine=false learns no bias")


def axes(doc: str = "the axis (or [axes]) each statistic reduces over") -> ArgSpec:
    return ArgSpec("axes", "axes", positional=True, doc=doc)


def eps(default: float) -> ArgSpec:
    return ArgSpec("eps", "expr", Num(default), doc="added inside the square root; must be > 0")


def offset(what: str) -> ArgSpec:
    return ArgSpec("offset", "int", 0, choices=(0, 1), doc=f"1 multiplies by (1 + {what}), stored as a deviation from one")


def name(arg: str, doc: str) -> ArgSpec:
    # unset means the default name, which the backend and the key table share
    return ArgSpec(arg, "name", None, doc=doc)


GAIN_NAME = name("weight_name", "the gain's key (weight unless set: g, gamma, scale, …)")
SHIFT_NAME = name("bias_name", "the shift's key (bias unless set: b, beta, …)")
