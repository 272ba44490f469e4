"""Norm parameters stored under a checkpoint's own names (weight_name=…, bias_name=…)."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import blockir
from blockir.analyses.keys import param_keys
from blockir.analyses.parallel import derive_plan
from blockir.analyses.sizes import Sizes
from blockir.ir.printer import format_program
from blockir.lower.fold import apply_folds

TEXT = """
dim B: batch
dim S: seq
dim D: model = 8
dim F: hidden = 16

block Layer(x: [B, S, D]) -> [B, S, D] {
  ln: layernorm(D, weight_name=gamma, bias_name=beta)
  ff: mlp(F, act=gelu)
  rms: rmsnorm(D, weight_name=g)
  proj: linear(D, D)

  h = x + ff(ln(x))
  y = h + proj(rms(h))
  return y
}
"""


class HandWritten(nn.Module):
    """The same layer as a plain PyTorch module whose norms call their parameters g, gamma and beta."""

    class LN(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.gamma = nn.Parameter(torch.ones(d))
            self.beta = nn.Parameter(torch.zeros(d))

        def forward(self, x: Tensor) -> Tensor:
            mu = x.mean(-1, keepdim=True)
            return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + 1e-5) * self.gamma + self.beta

    class RMS(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.g = nn.Parameter(torch.ones(d))

        def forward(self, x: Tensor) -> Tensor:
            return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * self.g

    class MLP(nn.Module):
        def __init__(self, d: int, f: int) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(d, f), nn.Linear(f, d)

        def forward(self, x: Tensor) -> Tensor:
            return self.fc2(nn.functional.gelu(self.fc1(x)))

    def __init__(self) -> None:
        super().__init__()
        self.ln, self.ff, self.rms, self.proj = self.LN(8), self.MLP(8, 16), self.RMS(8), nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        h = x + self.ff(self.ln(x))
        return h + self.proj(self.rms(h))


def test_keys_follow_the_stated_names() -> None:
    prog = blockir.parse(TEXT, "names.block")
    assert blockir.verify(prog) == []
    assert list(param_keys(prog, "Layer").shapes)[:2] == ["ln.gamma", "ln.beta"]
    assert "rms.g" in param_keys(prog, "Layer").shapes
    assert blockir.parse(format_program(prog), "names.block") == prog
    plan = derive_plan(prog, prog.block("Layer"), Sizes.of(prog, {"B": 2, "S": 4}), "sequence", 2)
    assert {k: v for k, v in plan.params.items() if k.startswith(("ln.", "rms."))} == {
        "ln.gamma": "replicate (gradient summed over tp)", "ln.beta": "replicate (gradient summed over tp)",
        "rms.g": "replicate (gradient summed over tp)"}


@pytest.mark.parametrize("backend", ["fx", "fused"])
def test_hand_written_checkpoint_loads_strictly_and_agrees(backend: str) -> None:
    ref = HandWritten().double()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.3 * torch.randn_like(p))
    m = blockir.compile(blockir.parse(TEXT, "names.block"), "Layer", backend=backend, seed=0, dtype=torch.float64)
    m.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    y, want = m(x), ref(x)
    torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)  # LayerNorm statistics accumulate in f32
    g = torch.randn_like(y)
    got = dict(zip([n for n, _ in m.named_parameters()], torch.autograd.grad(y, list(m.parameters()), g)))
    ref_grads = dict(zip([n for n, _ in ref.named_parameters()], torch.autograd.grad(want, list(ref.parameters()), g)))
    assert set(got) == set(ref_grads)
    for k in ("ln.gamma", "ln.beta", "rms.g"):
        torch.testing.assert_close(got[k], ref_grads[k], rtol=1e-5, atol=1e-5)


def test_affine_fold_moves_the_named_norm_state_into_the_linears() -> None:
    prog = blockir.parse(TEXT, "names.block")
    module = blockir.compile(prog, "Layer", dtype=torch.float64, seed=0).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    result = apply_folds(prog, "Layer", module)
    assert [(e.site.name, e.rule) for e in result.fired] == [("ln", "affine-into-linears"),
                                                              ("rms", "affine-into-linears")]
    assert set(module.state_dict()) - set(result.module.state_dict()) == {"ln.gamma", "ln.beta", "rms.g"}
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(result.module.eval()(x), module(x), rtol=1e-6, atol=1e-6)
