"""Lift on hand-written blocks: the recovered topology, its certificate, and the stacks."""
from __future__ import annotations

import pytest
import torch

import blockir
from blockir.diagnostics import BlockError
from lift_models import clean as C
from lift_models import one_thread  # noqa: F401  (fixture)

CLEAN = ["PreLN", "PostLN", "RMSPreLN", "Stack", "ParallelShared", "ParallelTwoNorms", "Sandwich", "CaiTBlock",
         "ReZero", "DeepNorm", "LlamaStyle", "HandLN", "Model"]


def _x() -> torch.Tensor:
    return torch.randn(2, 5, C.D, generator=torch.Generator().manual_seed(0))


def _lift(name: str) -> blockir.lift.LiftResult:
    torch.manual_seed(0)
    return blockir.lift(getattr(C, name)(), _x())


# DeepNet's alpha on the shortcut: one lifted layer cannot say which row of the DeepNet table (or which
# depth) the constant belongs to, so the verifiers report each constant shortcut weight as undeclared
WARNED = {"DeepNorm": ["W0403", "W0403"]}


@pytest.mark.parametrize("name", CLEAN)
def test_clean_blocks_lift_without_diagnostics_and_certify_equal(name: str) -> None:
    result = _lift(name)
    assert [d.code for d in result.diagnostics] == WARNED.get(name, []), result.render()
    # built-in norms written as nn.LayerNorm / RMSNorm reproduce the original bit for bit; the
    # hand-written LayerNorm's division order differs from the built-in's by one rounding
    assert result.max_error is not None and result.max_error <= (1e-6 if name == "HandLN" else 0.0)


def test_pre_ln_text() -> None:
    assert _lift("PreLN").text == """\
dim B: batch
dim S: seq
dim D: model = 32
dim F: hidden = 64

block PreLN(x: [B, S, D]) -> [B, S, D] {
  ln_1: layernorm(D, eps=1e-05)
  attn: extern(x: [B, S, D]) -> [B, S, D]
  ln_2: layernorm(D, eps=1e-05)
  mlp: mlp(F, act=gelu, bias=true)
  layer_norm = ln_1(x)
  attn_2 = attn(layer_norm)
  dropout_2 = dropout(attn_2, p=0.1)
  add = x + dropout_2
  layer_norm_1 = ln_2(add)
  mlp_2 = mlp(layer_norm_1)
  dropout_1 = dropout(mlp_2, p=0.1)
  add_1 = add + dropout_1
  return add_1
}
"""


def test_a_module_list_loop_with_a_final_norm_is_a_stack_in_a_model() -> None:
    text = _lift("Stack").text
    assert "model Stack(x: [B, S, D]) -> [B, S, D] {" in text
    assert "  layers: RMSPreLN * 3\n" in text and "  norm: rmsnorm(D, eps=1e-06, cast=before_weight)\n" in text
    assert text.count("block RMSPreLN(") == 1


def test_norm_gains_and_scales_keep_their_parameter_names() -> None:
    result = _lift("CaiTBlock")
    assert "  ls1.gamma: vector(D, init=1e-05)\n" in result.text
    assert "drop_path(mul, p=0.1)" in result.text
    program = result.program
    assert program is not None
    module = blockir.compile(program, result.block, bind=result.bind)
    assert set(module.state_dict()) == set(C.CaiTBlock().state_dict())


def test_deepnorm_shortcut_constant_and_rezero_scalar() -> None:
    assert f"mul = {(2 * 6) ** 0.25!r} * x" in _lift("DeepNorm").text
    assert "  resweight: scalar(init=0)\n" in _lift("ReZero").text


def test_hand_written_norms_become_their_declarations() -> None:
    assert "  ln: layernorm(D, eps=1e-05, two_pass=true)\n" in _lift("HandLN").text
    assert "  mlp: gated_mlp(F, act=silu, bias=false)\n" in _lift("LlamaStyle").text


def test_the_original_is_left_as_it_was() -> None:
    torch.manual_seed(0)
    module = C.CaiTBlock().eval()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    blockir.lift(module, _x())
    assert not module.training and all(m.training is False for m in module.modules())
    assert all(p.grad is None for p in module.parameters())
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())


def test_a_node_no_rule_matches_is_located_and_named() -> None:
    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = C.Attention()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.attn(x).exp()

    result = blockir.lift(Scaled(), _x())
    (d,) = result.diagnostics
    assert (d.code, d.span.filename, d.span.line) == ("E0901", __file__, Scaled.forward.__code__.co_firstlineno + 1)
    assert d.message == "no lift rule matches 'exp' (call_method exp)"
    assert result.text == "" and result.max_error is None


def test_misuse_is_a_block_error() -> None:
    with pytest.raises(BlockError, match="lift expects an nn.Module, got int"):
        blockir.lift(3, _x())
    with pytest.raises(BlockError, match=r"residual stream and must be \[batch, seq, features\]"):
        blockir.lift(C.PreLN(), torch.randn(5, C.D))
