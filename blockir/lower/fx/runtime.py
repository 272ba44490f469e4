"""The functions a generated forward calls, and the namespace lowering hooks reach them through.

The op kinds under ``blockir/ops/`` do not import torch, so a lowering hook names what its node
calls as an attribute of :class:`Runtime` (``b.rt.inplace_add``), handed to it by the builder. The
functions themselves stay plain module-level functions: traces and the lift's pattern table
recognise them by identity.
"""
from __future__ import annotations

import zlib
from typing import Any

import torch

from blockir.lower.boundary import TORCH_DTYPES
from blockir.lower.layers import numerics
from blockir.lower.rng import dropout_key

SEED_HIGH = 1 << 62
SPLAT = "**"  # the keyword under which a node passes the whole context on; printed as **ctx


def context(ctx: Any) -> dict[str, Any]:
    """The keyword context a block hands to its branches, sub-blocks and externs.

    Generated code calls this once on its ``**ctx``. Under ``fx.Interpreter``
    (non-strict ``torch.export``) a ``**ctx`` placeholder is bound to a list and
    under ``torch.fx.symbolic_trace`` to a Proxy: both mean "no context". A parent
    run by an interpreter passes its context as the single keyword ``"**"``.
    """
    if type(ctx) is not dict:
        return {}
    if SPLAT in ctx:
        inner = ctx[SPLAT]
        rest = {k: v for k, v in ctx.items() if k != SPLAT}
        return {**(inner if type(inner) is dict else {}), **rest}
    return ctx


def inplace_add(target: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """A residual add written over the shortcut's buffer, as the inference buffer plan allows.

    With autograd recording, the overwritten value could still be needed for backward, so the
    add falls back to a fresh tensor: an inference module stays correct when called with grad.
    """
    if torch.is_grad_enabled():
        return target + other
    return target.add_(other)


def draw_seed(training: bool) -> torch.Tensor:
    """One draw from torch's generator per forward; replayed by checkpointing's RNG-state restore."""
    if not training:
        return torch.zeros((), dtype=torch.int64)
    return torch.randint(0, SEED_HIGH, (), dtype=torch.int64)


def site_id(ssa: str) -> int:
    """A dropout site's RNG identity: a hash of its value name, stable under fusion and reordering."""
    return zlib.crc32(ssa.encode())


# no value can be called layer_drop (a built-in name), so no dropout site shares this identity
LAYER_DROP_SITE = site_id("layer_drop")


def dropout_site(x: torch.Tensor, p: float, mask: str, training: bool, seed: torch.Tensor,
                 layer: int, site: int) -> torch.Tensor:
    """Inverted dropout whose mask is a function of (seed, layer, site, row, col)."""
    if not training or p == 0.0:
        return x
    return numerics.dropout(x, p, mask, training, dropout_key(seed, layer, site))


def layer_drop_site(x: torch.Tensor, p: float, training: bool, seed: torch.Tensor, layer: int) -> torch.Tensor:
    """LayerDrop keyed by (seed, layer) only: every ``layer_drop`` of one layer shares the draw."""
    if not training or p == 0.0:
        return x
    return numerics.layer_drop(x, p, training, dropout_key(seed, layer, LAYER_DROP_SITE))


def zeros_of(template: torch.Tensor, sizes: tuple[int, ...]) -> torch.Tensor:
    """Zeros in the dtype and on the device of ``template`` (the block's first input)."""
    return template.new_zeros(sizes, dtype=template.dtype if template.is_floating_point() else None)


class Runtime:
    """What the fx backend's graphs call, by name, for the lowering hooks of the op kinds.

    A backend that lowers some kinds differently extends it with its own functions.
    """

    TORCH_DTYPES = TORCH_DTYPES
    ACTIVATIONS = numerics.ACTIVATIONS
    cat = staticmethod(torch.cat)
    complement = staticmethod(numerics.complement)
    offset_weight = staticmethod(numerics.offset_weight)
    inplace_add = staticmethod(inplace_add)
    dropout_site = staticmethod(dropout_site)
    layer_drop_site = staticmethod(layer_drop_site)
    zeros_of = staticmethod(zeros_of)
    site_id = staticmethod(site_id)
