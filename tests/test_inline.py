"""Inlining dropout-free stacks lets the fusion pass fuse boundaries between layers."""
from __future__ import annotations

import torch

import blockir
from blockir import ops as O
from blockir.passes.fuse import fuse_program
from blockir.analyses.sizes import Sizes
from blockir.passes.inline import inline_stacks
from conftest import ROOT


def _fused_ops(path: str, name: str) -> list[O.FusedAddNormOp]:
    program = blockir.load(ROOT / "examples" / path)
    program, _ = fuse_program(inline_stacks(program, name, Sizes.of(program))[0])
    return [op for op in program.block(name).ops if isinstance(op, O.FusedAddNormOp)]


def test_llama_fuses_every_boundary_including_the_final_norm() -> None:
    ops = _fused_ops("llama.block", "LlamaModel")
    assert [(op.decl, op.residual) for op in ops] == [
        ("layers.0.post_attention_layernorm", "layers.0.h"),
        ("layers.1.input_layernorm", "layers.0.y"),  # across the layer boundary
        ("layers.1.post_attention_layernorm", "layers.1.h"),
        ("norm", "layers.1.y"),  # into the stack's final norm
    ]


def test_inlined_module_keeps_keys_and_trace_names() -> None:
    path = ROOT / "examples" / "llama.block"
    fx = blockir.compile(path, "LlamaModel", seed=0).eval()
    fused = blockir.compile(path, "LlamaModel", "fused", seed=0).eval()
    assert list(fused.state_dict()) == list(fx.state_dict())
    x = torch.randn(2, 5, 64)
    y0, v0 = blockir.trace(fx, x)
    y1, v1 = blockir.trace(fused, x)
    torch.testing.assert_close(y1, y0, rtol=0, atol=0)
    for name in ("layers.0.h", "layers.0.y", "layers.1.h", "layers.1.y"):
        torch.testing.assert_close(v1[name], v0[name], rtol=0, atol=0)


def test_per_layer_constants_are_substituted() -> None:
    program = blockir.load(ROOT / "examples" / "deepnorm.block")
    program, changed = inline_stacks(program, "DeepNormDecoder", Sizes.of(program))
    assert changed
    block = program.block("DeepNormDecoder")
    gains = {d.name: d.arg("init_gain") for d in block.decls if d.name.endswith(".self_attn")}
    assert len(gains) == 24
    env: dict[str, float] = {}
    assert {round(blockir.ir.consts.evaluate(g, env), 12) for g in gains.values()} == {round((8 * 24) ** -0.25, 12)}


def test_stacks_that_draw_dropout_stay_separate_layers() -> None:
    for path, name in (("layerscale.block", "LayerScaleEncoder"), ("rezero.block", "ReZeroModel")):
        program = blockir.load(ROOT / "examples" / path)
        assert inline_stacks(program, name, Sizes.of(program)) == (program, False)
