"""LayerNorm's upcast and recenter: bit for bit what the code they name computes, forward and every gradient."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import blockir  # noqa: E402

HEADER = "dim B: batch\ndim S: seq\ndim D: model = 16\n"


def _olmo(x, weight, bias):
    """OLMo's parameter-free LayerNorm: the kernel on an f32 copy, cast back."""
    return F.layer_norm(x.to(torch.float32), (x.shape[-1],), None, None, eps=1e-5).to(x.dtype)


def _cohere(x, weight, bias):
    """Cohere's LayerNorm: the mean subtracted twice, the gain in f32, one cast back."""
    h = x.to(torch.float32)
    mean = h.mean(-1, keepdim=True)
    variance = (h - mean).pow(2).mean(-1, keepdim=True)
    h = (h - mean) * torch.rsqrt(variance + 1e-5)
    return (weight.to(torch.float32) * h).to(x.dtype)


CASES = {"upcast": ("layernorm(D, eps=1e-5, affine=false, upcast=true)", _olmo),
         "recenter": ("layernorm(D, eps=1e-5, bias=false, two_pass=true, recenter=true)", _cohere)}


@pytest.mark.parametrize("backend", ["fx", "fused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_layernorm_option_is_bit_exact_with_the_code_it_names(case: str, dtype: torch.dtype, backend: str) -> None:
    decl, reference = CASES[case]
    text = HEADER + f"block T(x: [B, S, D]) -> [B, S, D] {{\n  ln: {decl}\n  y = x + ln(x)\n  return y\n}}\n"
    m = blockir.compile(blockir.parse(text), "T", seed=0, backend=backend, dtype=dtype)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen).to(dtype))
    weight = dict(m.named_parameters()).get("ln.weight")
    x = (2 + 3 * torch.randn(3, 5, 16, generator=gen)).to(dtype).requires_grad_(True)
    y = m(x)
    params = [weight] if weight is not None else []
    got = torch.autograd.grad(y, [x, *params], torch.linspace(-1, 1, 16).to(dtype).expand_as(y))
    x_ref = x.detach().clone().requires_grad_(True)
    w_ref = [weight.detach().clone().requires_grad_(True)] if weight is not None else []
    want_y = x_ref + reference(x_ref, *(w_ref or [None]), None)
    want = torch.autograd.grad(want_y, [x_ref, *w_ref], torch.linspace(-1, 1, 16).to(dtype).expand_as(want_y))
    assert torch.equal(y, want_y)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
