"""x-transformers' Encoder and Decoder lift with a zero certificate for several residual options; their final
norm is the model's, not a post-norm of the last update."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import blockir
from lift_models import one_thread  # noqa: F401  (fixture)

xt = pytest.importorskip("x_transformers", reason="x-transformers is in the test extras; not installed here")


@pytest.mark.parametrize("cls, options, final", [
    ("Encoder", {"pre_norm": False}, None),
    ("Encoder", {}, "LayerNorm"),
    ("Decoder", {"sandwich_norm": True}, "LayerNorm"),
    ("Encoder", {"use_rmsnorm": True}, "RMSNorm"),
])
def test_attention_layers_lift_certified(cls: str, options: dict, final: str | None) -> None:
    torch.manual_seed(0)
    module = getattr(xt, cls)(dim=32, depth=2, heads=4, **options)
    result = blockir.lift(module, torch.randn(2, 5, 32))
    # its layers are lists of (norms, block, residual), not modules: every update is in the root, and with
    # Pre-LN the norm module after the last add is the model's final norm, a block of its own
    assert result.diagnostics == [], result.render()
    assert result.max_error == 0.0
    assert result.text.count(": extern(x: [B, S, D]) -> [B, S, D]") == 4  # 2 attention + 2 feed-forward
    if final is None:  # Post-LN: the last norm is the last update's, in the one block
        assert f"block {cls}(x: [B, S, D]) -> [B, S, D] {{" in result.text and "final_norm" not in result.text
    else:
        assert f"model {cls}(x: [B, S, D]) -> [B, S, D] {{" in result.text
        assert f"  final_norm: {final}\n" in result.text and f"block {final}(x: [B, S, D])" in result.text
        assert "  final_norm." not in result.text  # its declarations are the norm block's, under the instance


class GainNorm(nn.Module):
    """A norm and a learned gain in one module, as x-transformers' LayerNorm is."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d, elementwise_affine=False)
        self.gamma = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gamma * self.ln(x)


class Listed(nn.Module):
    """Two updates kept in lists; ``mixed``: the second is normalized after its add (Post-LN), the first before."""

    def __init__(self, d: int = 16, mixed: bool = False) -> None:
        super().__init__()
        self.mixed = mixed
        self.norms = nn.ModuleList([GainNorm(d) for _ in range(1 if mixed else 2)])
        self.branches = nn.ModuleList([nn.Linear(d, d), nn.Linear(d, d)])
        self.final_norm = GainNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.branches[0](self.norms[0](x))
        if self.mixed:
            return self.final_norm(x + self.branches[1](x))
        x = x + self.branches[1](self.norms[1](x))
        return self.final_norm(x)


@pytest.mark.parametrize("mixed", [False, True])
def test_only_a_pre_ln_stream_has_its_closing_norm_written_as_the_models(mixed: bool) -> None:
    torch.manual_seed(0)
    result = blockir.lift(Listed(mixed=mixed), torch.randn(2, 5, 16))
    assert result.max_error == 0.0
    if not mixed:
        assert result.diagnostics == [], result.render()
        assert "model Listed(" in result.text and "  final_norm: GainNorm\n" in result.text
        return
    # a real Pre/Post mix in one block: the closing norm stays in it, and the placements disagree
    assert "block Listed(" in result.text and "  final_norm.gamma: vector(D" in result.text
    assert [d.code for d in result.diagnostics] == ["W0401"], result.render()
    assert "'branches.0' is pre, 'branches.1' is post" in result.diagnostics[0].message
