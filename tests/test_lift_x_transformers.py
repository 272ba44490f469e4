"""x-transformers' Encoder and Decoder lift with a zero certificate for several residual options."""
from __future__ import annotations

import pytest
import torch

import blockir
from lift_models import one_thread  # noqa: F401  (fixture)

xt = pytest.importorskip("x_transformers", reason="x-transformers is in the test extras; not installed here")


@pytest.mark.parametrize("cls, options, warnings", [
    ("Encoder", {"pre_norm": False}, []),
    ("Encoder", {}, ["W0401"]),
    ("Decoder", {"sandwich_norm": True}, ["W0401"]),
    ("Encoder", {"use_rmsnorm": True}, ["W0401"]),
])
def test_attention_layers_lift_certified(cls: str, options: dict, warnings: list[str]) -> None:
    torch.manual_seed(0)
    module = getattr(xt, cls)(dim=32, depth=2, heads=4, **options)
    result = blockir.lift(module, torch.randn(2, 5, 32))
    # its layers are not modules of their own, so the final norm closes the last update of one block
    # and the norm-placement check sees that update as pre+post (a warning, not an error)
    assert [d.code for d in result.diagnostics] == warnings, result.render()
    assert result.max_error == 0.0
    assert result.text.count(": extern(x: [B, S, D]) -> [B, S, D]") == 4  # 2 attention + 2 feed-forward
