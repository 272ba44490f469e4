"""Partial RMSNorm (Zhang and Sennrich, "Root Mean Square Layer Normalization", NeurIPS 2019): the RMS is
estimated from the first ceil(p * D) features, and the whole row is divided by it."""
from __future__ import annotations

import math

import pytest
import torch

import blockir
from blockir.lower.layers.norm_module import make_norm
from blockir.norms import FAMILIES

D = 64
BLOCK = """dim B: batch
dim S: seq
dim D: model = 64
block T(x: [B, S, D]) -> [B, S, D] {{
  norm: rmsnorm(D, partial={p})
  proj: linear(D, D)
  y = x + proj(norm(x))
  return y
}}
"""


def _x(seed: int, *shape: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3 + 1).to(dtype)


def oracle(x: torch.Tensor, w: torch.Tensor, p: float, eps: float) -> torch.Tensor:
    """pRMSNorm written out: RMS_p(x) = sqrt(1/k sum_{i <= k} x_i^2), k = ceil(n p); y = x / (RMS_p + eps) * g,
    with eps inside the root as RMSNorm here takes it."""
    k = math.ceil(x.shape[-1] * p)
    rms = torch.sqrt(sum(x[..., i] ** 2 for i in range(k)) / k + eps)
    return w * (x / rms.unsqueeze(-1))


@pytest.mark.parametrize(("p", "features"), [(0.0625, 4), (0.3, 20), (1.0, 64)])
def test_partial_rms_matches_the_oracle(p: float, features: int) -> None:
    m = make_norm("rmsnorm", D, partial=p, accum="f64", eps=1e-6).double()
    with torch.no_grad():
        m.weight.copy_(1 + 0.2 * _x(1, D))
    assert m.features == features
    x = _x(0, 3, 5, D)
    torch.testing.assert_close(m(x), oracle(x, m.weight.detach(), p, 1e-6), rtol=1e-13, atol=1e-13)
    # only the first features set the scale: the rest of the row passes through it unchanged
    y = x.clone()
    y[..., features:] *= 7
    if features < D:
        torch.testing.assert_close(m(y)[..., :features], m(x)[..., :features], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("cast", ["before_weight", "after_weight", "weight_dtype"])
def test_partial_one_is_the_full_rmsnorm_bit_for_bit(cast: str) -> None:
    x = _x(2, 2, 7, D, dtype=torch.bfloat16)
    full, partial = (make_norm("rmsnorm", D, cast=cast, **kw).to(torch.bfloat16) for kw in ({}, {"partial": 1.0}))
    assert torch.equal(full(x), partial(x))


def test_a_compiled_block_has_the_rmsnorm_keys_and_is_not_fused() -> None:
    program = blockir.parse(BLOCK.format(p=0.25))
    assert [d for d in blockir.verify(program) if d.is_error] == []
    m = blockir.compile(program, "T", dims={"B": 2, "S": 3})
    assert list(m.state_dict())[:1] == ["norm.weight"] and m.norm.features == 16
    decl = program.block("T").decl_map["norm"]
    assert not FAMILIES["rmsnorm"].fuses(decl) and FAMILIES["rmsnorm"].manifest(decl, lambda e: e.value)["partial"] \
        == 0.25


@pytest.mark.parametrize("p", ["0", "1.5"])
def test_a_share_outside_zero_one_is_refused(p: str) -> None:
    diags = [d for d in blockir.verify(blockir.parse(BLOCK.format(p=p))) if d.is_error]
    assert [(d.code, d.message) for d in diags] == [(
        "E0470", f"rmsnorm 'norm' has partial={float(p):g}: the share of the features its RMS is estimated from "
                 "must be in (0, 1]")]
