"""backend="fused": the fusion pass and its lowering equal the unfused graph exactly."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import blockir
from blockir.lifecycle.session import stand_ins
from blockir import ops as O
from blockir.ir.printer import format_block
from blockir.passes.fuse import fuse_program
from conftest import EXAMPLES, ROOT, check_golden

GOLDEN = ROOT / "tests" / "golden" / "fused"
DIMS = {"B": 2, "S": 5, "T": 4}


def _dims(program) -> dict[str, int]:
    return {k: v for k, v in DIMS.items() if k in program.dim_map}


def _outer(program: blockir.ir.Program) -> blockir.ir.Block:
    models = [b for b in program.blocks if b.kind == "model"]
    return (models or list(program.blocks))[-1]


def _inputs(program, block, gen) -> list[torch.Tensor]:
    from blockir.lifecycle.session import random_inputs
    return [t.requires_grad_() for t in random_inputs(program, block, _dims(program), gen)]


def _run(module: torch.nn.Module, inputs: list[torch.Tensor], seed: int) -> tuple[torch.Tensor, list, dict]:
    for t in inputs:
        t.grad = None
    torch.manual_seed(seed)
    y = module(*inputs)
    (y * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
    grads = {k: p.grad.clone() for k, p in module.named_parameters() if p.grad is not None}
    return y.detach(), [t.grad.clone() for t in inputs], grads


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_fused_equals_fx_forward_and_gradients(path: Path) -> None:
    program = blockir.load(path)
    block = _outer(program)
    dims = _dims(program)
    bind = stand_ins(program, block, dims)
    fx = blockir.compile(program, block.name, dims=dims, bind=bind, seed=1).train()
    fused = blockir.compile(program, block.name, "fused", dims=dims, bind=copy.deepcopy(bind), seed=1).train()
    fused.load_state_dict(fx.state_dict(), strict=True)
    inputs = _inputs(program, block, torch.Generator().manual_seed(0))
    y0, gx0, gp0 = _run(fx, inputs, seed=7)
    y1, gx1, gp1 = _run(fused, inputs, seed=7)
    torch.testing.assert_close(y1, y0, rtol=1e-6, atol=1e-6)
    # the fused backward is analytic: fp32 sums in another order, so compare relative to each tensor's scale
    for a, b in zip(gx1, gx0):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())
    assert gp1.keys() == gp0.keys()
    # some gradients are zero in exact arithmetic (a key bias shifts every score equally) and are
    # pure rounding noise in both graphs, so the floor is relative to the largest gradient
    floor = 1e-6 * max(g.abs().max().item() for g in gp0.values())
    for k in gp0:
        scale = gp0[k].abs().max().item()
        err = (gp1[k] - gp0[k]).abs().max().item()
        assert err <= 1e-5 * scale + floor, f"{k}: max error {err:.3g} at scale {scale:.3g}"


@pytest.mark.parametrize("name", ["llama", "bert", "deepnorm", "gemma2", "torch_encoder"])
def test_fused_ir_golden(name: str) -> None:
    program, changed = fuse_program(blockir.parse((ROOT / "examples" / f"{name}.block").read_text(), f"{name}.block"))
    assert changed
    text = "\n\n".join(format_block(b) for b in program.blocks) + "\n"
    check_golden(GOLDEN / f"{name}.ir", text)


def test_fused_program_verifies_clean() -> None:
    for path in EXAMPLES:
        program, _ = fuse_program(blockir.load(path))
        errors = [d for d in blockir.verify(program) if d.is_error]
        assert errors == [], path


BASE = """
dim B: batch
dim S: seq
dim D: model = 8
block L(x: [B, S, D]) -> [B, S, D] {
  attn: self_attention(heads=2)
  ln: layernorm(D)
  %s
}
"""


def _fused_ops(body: str) -> list[O.FusedAddNormOp]:
    program, _ = fuse_program(blockir.parse(BASE % body))
    return [op for op in program.block("L").ops if isinstance(op, O.FusedAddNormOp)]


def test_refuses_row_and_sample_dropout() -> None:
    assert _fused_ops("h = ln(x + dropout(attn(x), p=0.1, mask=row))\n  return h") == []
    assert _fused_ops("h = ln(x + drop_path(attn(x), p=0.1))\n  return h") == []
    (op,) = _fused_ops("h = ln(x + dropout(attn(x), p=0.1))\n  return h")
    assert (op.branch, op.shortcut, op.site) == ("%0", "x", "%1")


def test_refuses_when_an_absorbed_value_has_another_reader() -> None:
    # the dropped branch is also returned, so the fused op could not provide it
    body = "d = dropout(attn(x), p=0.1)\n  h = ln(x + d)\n  y = h + d\n  return y"
    (op,) = _fused_ops(body)
    assert op.p is None and op.branch == "d"  # the add and norm still fuse; the dropout stays outside


def test_deepnorm_shortcut_scale_is_absorbed() -> None:
    (op,) = _fused_ops("const a = 2.0\n  h = ln(a * x + attn(x))\n  return h")
    assert op.shortcut == "x" and op.shortcut_factor is not None


def test_fused_dropout_replays_under_checkpoint() -> None:
    program = blockir.load(ROOT / "examples" / "bert.block")
    bind = stand_ins(program, program.block("BertLayer"), _dims(program))
    m = blockir.compile(program, "BertLayer", "fused", dims=_dims(program), bind=bind, seed=0).train()
    x = torch.randn(2, 5, 64, requires_grad=True)
    torch.manual_seed(11)
    y0 = m(x)
    (g0,) = torch.autograd.grad(y0.sum(), x)
    torch.manual_seed(11)
    y1 = torch.utils.checkpoint.checkpoint(m, x, use_reentrant=False)
    (g1,) = torch.autograd.grad(y1.sum(), x)
    assert torch.equal(y0, y1) and torch.equal(g0, g1)
    torch.manual_seed(12)
    assert not torch.equal(m(x), y0)  # a new forward draws a new mask


def test_torch_compile_fullgraph_fused_llama() -> None:
    m = blockir.compile(ROOT / "examples" / "llama.block", "LlamaModel", "fused", seed=0).eval()
    x = torch.randn(2, 5, 64)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), m(x), rtol=0, atol=0)
