"""Checkpoint names as released: index path parts and single-element parameters of either shape."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import blockir
from blockir.analyses.keys import param_keys
from blockir.ir.printer import format_program

HEADER = "dim B: batch\ndim S: seq\ndim D: model = 8\n"

NESTED = HEADER + """
block T(x: [B, S, D]) -> [B, S, D] {
  layers.2.0.0.gamma: scalar(init=0.5)
  layers.2.norm: rmsnorm([D], accum=f64)
  h = layers.2.norm(x)
  return x + layers.2.0.0.gamma * h
}
"""


class Gamma(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.tensor(0.7, dtype=torch.float64))


def _nested_reference() -> nn.Module:
    """A ModuleList inside a ModuleList, as released code builds it: ``layers.2.0.0.gamma``."""
    ref = nn.Module()
    inner = nn.ModuleList([nn.ModuleList([Gamma()])])
    inner.norm = nn.RMSNorm(8, eps=1e-6, dtype=torch.float64)
    with torch.no_grad():
        inner.norm.weight.copy_(torch.linspace(0.5, 1.5, 8))
    ref.layers = nn.ModuleList([nn.Identity(), nn.Identity(), inner])
    return ref


def _x() -> Tensor:
    return torch.randn(2, 3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def test_index_parts_parse_print_and_key() -> None:
    program = blockir.parse(NESTED)
    assert blockir.parse(format_program(program)) == program
    assert [k.name for k in param_keys(program, "T").keys] == ["layers.2.0.0.gamma", "layers.2.norm.weight"]


@pytest.mark.parametrize("backend", ["fx", "fused"])
def test_index_parts_load_a_nested_module_list_strictly(backend: str) -> None:
    ref = _nested_reference()
    m = blockir.compile(blockir.parse(NESTED), "T", backend=backend, dims={"B": 2, "S": 3}, dtype=torch.float64)
    assert list(m.state_dict()) == list(ref.state_dict())
    m.load_state_dict(ref.state_dict(), strict=True)
    assert blockir.reconcile(blockir.parse(NESTED), "T", ref.state_dict()).ok
    x = _x()
    inner = ref.layers[2]
    torch.testing.assert_close(m(x), x + inner[0][0].gamma * inner.norm(x), rtol=0, atol=1e-12)
    assert m.get_submodule("layers.2.0.0").gamma is m.state_dict(keep_vars=True)["layers.2.0.0.gamma"]


def test_a_name_cannot_start_with_an_index() -> None:
    with pytest.raises(blockir.BlockError) as exc:
        blockir.parse(HEADER + "block T(x: [B, S, D]) -> [B, S, D] {\n  2.g: scalar\n  return g * x\n}\n", "t.block")
    assert exc.value.diagnostics[0].span.line == 5


ONE = HEADER + """
block T(x: [B, S, D]) -> [B, S, D] {
  g: scalar(init=0.5)
  n: dyt([D])
  return x + g * n(x)
}
"""


class DyTRef(nn.Module):
    """DyT as released code writes it, with ``alpha`` stored 0-d or as ``[1]``."""

    def __init__(self, alpha_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full(alpha_shape, 0.8, dtype=torch.float64))
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, 8, dtype=torch.float64))
        self.bias = nn.Parameter(torch.linspace(-0.2, 0.2, 8, dtype=torch.float64))

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * torch.tanh(self.alpha * x) + self.bias


@pytest.mark.parametrize("backend", ["fx", "fused"])
@pytest.mark.parametrize("shape", [(), (1,)])
def test_single_numbers_load_zero_d_or_one_element(backend: str, shape: tuple[int, ...]) -> None:
    ref = nn.Module()
    ref.g = nn.Parameter(torch.full(shape, 0.3, dtype=torch.float64))
    ref.n = DyTRef(shape)
    program = blockir.parse(ONE)
    assert blockir.reconcile(program, "T", ref.state_dict()).ok
    m = blockir.compile(program, "T", backend=backend, dims={"B": 2, "S": 3}, dtype=torch.float64)
    m.load_state_dict(ref.state_dict(), strict=True)
    assert m.state_dict()["g"].shape == () and m.state_dict()["n.alpha"].shape == (1,)
    x = _x()
    torch.testing.assert_close(m(x), x + ref.g * ref.n(x), rtol=0, atol=1e-12)


def test_single_numbers_in_a_stack_load_either_way() -> None:
    program = blockir.parse(ONE + "block M(x: [B, S, D]) -> [B, S, D] {\n  layers: T * 2\n  return layers(x)\n}\n")
    m = blockir.compile(program, "M", dims={"B": 2, "S": 3}, dtype=torch.float64)
    state = {k: (v.reshape(1) if v.dim() == 0 else v.reshape(()) if v.shape == (1,) else v)
             for k, v in m.state_dict().items()}
    assert blockir.reconcile(program, "M", state).ok
    m.load_state_dict(state, strict=True)


def test_a_wider_tensor_is_still_misshaped() -> None:
    report = blockir.reconcile(blockir.parse(ONE), "T", {"g": (2,), "n.alpha": (1,), "n.weight": (8,), "n.bias": (8,)})
    assert report.misshaped == (("g", (), (2,)),)
