"""Forward and every gradient of a compiled float64 module against a reference written from the equations."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

Reference = Callable[[Tensor, dict[str, Tensor]], Tensor]


def assert_matches_reference(m: torch.nn.Module, reference: Reference, shape: tuple[int, ...]) -> None:
    """``m(x)`` and the gradients of ``x`` and of every parameter equal ``reference(x, params)``'s to 1e-10.

    The parameters are moved off their init first, so that a zeroed layer, a unit gain or a dropped offset
    cannot hide a term."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    names = [n for n, _ in m.named_parameters()]
    x = torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)
    y = m(x)
    grad_out = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(y, [x, *m.parameters()], grad_out)
    params = {n: p.detach().clone().requires_grad_(True) for n, p in m.named_parameters()}
    x_ref = x.detach().clone().requires_grad_(True)
    want_y = reference(x_ref, params)
    want = torch.autograd.grad(want_y, [x_ref, *params.values()], grad_out)
    torch.testing.assert_close(y, want_y, rtol=1e-10, atol=1e-10)
    for name, g, w in zip(["x", *names], got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=lambda msg, n=name: f"gradient of {n}: {msg}")
