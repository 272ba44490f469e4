"""Numerics the released code uses: transformers' activations, an explicit two-pass LayerNorm, F.normalize."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.activations import ACT2FN

import blockir
from blockir.ir.kinds import ACTIVATIONS
from blockir.ir.printer import format_program

HEADER = """
dim B: batch
dim S: seq
dim D: model = 8
dim F: hidden = 16
"""
D = 8
HF_NAME = {"gelu_tanh": "gelu_pytorch_tanh", "identity": "linear"}  # the rest share the name


def _compile(body: str, backend: str, dtype: torch.dtype) -> torch.nn.Module:
    return blockir.compile(blockir.parse(HEADER + body), "T", seed=0, backend=backend, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn", ACTIVATIONS)
def test_activation_is_bit_exact_with_act2fn(fn: str, dtype: torch.dtype) -> None:
    body = f"""
block T(x: [B, S, D]) -> [B, S, D] {{
  y = {fn}(x)
  return y
}}"""
    m = _compile(body, "fx", dtype)
    x = (4 * torch.randn(4, 64, D, generator=torch.Generator().manual_seed(0))).to(dtype).requires_grad_(True)
    y = m(x)
    (gx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    x_ref = x.detach().clone().requires_grad_(True)
    if fn == "gelu_bloom":  # not in ACT2FN: BLOOM's own module, with its written-out derivative
        from transformers.models.bloom.modeling_bloom import BloomGelu
        want = BloomGelu()(x_ref)
    else:
        want = ACT2FN[HF_NAME.get(fn, fn)](x_ref)
    (want_gx,) = torch.autograd.grad(want, x_ref, torch.ones_like(want))
    assert torch.equal(y, want)
    assert torch.equal(gx, want_gx)


@pytest.mark.parametrize("backend", ["fx", "fused"])
@pytest.mark.parametrize("fn", ["gelu_new", "quick_gelu", "relu2", "gelu_pytorch_tanh"])
def test_mlp_with_an_act2fn_activation(fn: str, backend: str) -> None:
    body = f"""
block T(x: [B, S, D]) -> [B, S, D] {{
  ln: layernorm(D)
  mlp: mlp(F, act={fn})
  y = x + mlp(ln(x))
  return y
}}"""
    m = _compile(body, backend, torch.float32)
    x = torch.randn(2, 3, D, generator=torch.Generator().manual_seed(1))
    sd = m.state_dict()
    h = F.layer_norm(x, (D,), sd["ln.weight"], sd["ln.bias"], 1e-5)
    want = x + F.linear(ACT2FN[fn](F.linear(h, sd["mlp.fc1.weight"], sd["mlp.fc1.bias"])), sd["mlp.fc2.weight"],
                        sd["mlp.fc2.bias"])
    assert torch.equal(m(x), want)


class ExplicitLayerNorm(torch.nn.Module):
    """LayerNorm as released code writes it: fp32 two-pass statistics, the affine in fp32, then the cast."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))
        self.bias = torch.nn.Parameter(torch.zeros(width))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        centered = h - h.mean(-1, keepdim=True)
        var = centered.pow(2).mean(-1, keepdim=True)
        h = centered * torch.rsqrt(var + self.eps)
        return (h * self.weight.float() + self.bias.float()).to(x.dtype)


TWO_PASS = """
block T(x: [B, S, D]) -> [B, S, D] {
  ln: layernorm(D, eps=1e-5, two_pass=true)
  y = x + ln(x)
  return y
}"""


@pytest.mark.parametrize("backend", ["fx", "fused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_pass_layernorm_is_bit_exact_with_the_explicit_code(dtype: torch.dtype, backend: str) -> None:
    m = _compile(TWO_PASS, backend, dtype)
    ref = ExplicitLayerNorm(D, 1e-5).to(dtype)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for q in m.parameters():
            q.add_(0.5 * torch.randn(q.shape, generator=gen).to(dtype))
    ref.load_state_dict({k.removeprefix("ln."): v for k, v in m.state_dict().items()}, strict=True)
    x = (3 + 2 * torch.randn(4, 32, D, generator=gen)).to(dtype).requires_grad_(True)
    y = m(x)
    grads = torch.autograd.grad(y, [x, *m.parameters()], torch.ones_like(y))
    x_ref = x.detach().clone().requires_grad_(True)
    want = x_ref + ref(x_ref)
    want_grads = torch.autograd.grad(want, [x_ref, *ref.parameters()], torch.ones_like(want))
    assert torch.equal(y, want)
    for g, w in zip(grads, want_grads):
        assert torch.equal(g, w)


def test_two_pass_is_selectable_and_round_trips() -> None:
    program = blockir.parse(HEADER + TWO_PASS)
    printed = format_program(program)
    assert "two_pass=true" in printed and blockir.parse(printed) == program
    unset = format_program(blockir.parse(HEADER + TWO_PASS.replace(", two_pass=true", "")))
    assert "two_pass" not in unset  # an unset argument is omitted: the kernel


L2 = """
block T(x: [B, S, D]) -> [B, S, D] {
  n: l2norm(D, eps=1e-6)
  g: vector(D, init=2.0)
  y = n(x + g * n(x))
  return y
}"""


@pytest.mark.parametrize("backend", ["fx", "fused"])
def test_l2norm_is_f_normalize(backend: str) -> None:
    program = blockir.parse(HEADER + L2)
    assert [d for d in blockir.verify(program) if d.is_error] == []
    m = _compile(L2, backend, torch.float64)
    assert list(m.state_dict()) == ["g"]  # the norm learns nothing
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, D, generator=gen, dtype=torch.float64)
    x[0, 0] = 0.0  # a zero row stays zero: the norm is clamped, not offset
    x.requires_grad_(True)
    with torch.no_grad():
        m.g.add_(torch.randn(D, generator=gen, dtype=torch.float64))
    y = m(x)
    grads = torch.autograd.grad(y, [x, m.g], torch.ones_like(y))
    x_ref, g = x.detach().clone().requires_grad_(True), m.g.detach().clone().requires_grad_(True)
    want = F.normalize(x_ref + g * F.normalize(x_ref, dim=-1, eps=1e-6), dim=-1, eps=1e-6)
    want_grads = torch.autograd.grad(want, [x_ref, g], torch.ones_like(want))
    assert torch.equal(y, want)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert torch.equal(y[0, 0], torch.zeros(D, dtype=torch.float64))
    assert blockir.parse(format_program(program)) == program
