"""DyT at LLM sites (arXiv:2503.10622): the alpha table, the rewritten model, and its equations in float64."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import blockir
from blockir.analyses.classify import classify_program
from blockir.norms.dyt import llm_alpha as dyt_llm_alpha
from blockir.passes.recipes import RecipeError, dyt_llm
from reference_attention import causal_attention
from oracle import assert_matches_reference

SOURCE = """
dim B: batch
dim S: seq
dim D: model = {width}
dim F: hidden = 2 * D
dim H: heads = 4

block Layer(x: [B, S, D]) -> [B, S, D] {{
  input_layernorm: rmsnorm(D)
  self_attn: self_attention(heads=H, causal=true)
  post_attention_layernorm: rmsnorm(D)
  mlp: mlp(F, act=gelu)

  h = x + self_attn(input_layernorm(x))
  y = h + mlp(post_attention_layernorm(h))
  return y
}}

model Model(x: [B, S, D]) -> [B, S, D] {{
  layers: Layer * 2
  norm: rmsnorm(D)
  return norm(layers(x))
}}
"""


def _program(width: int) -> blockir.Program:
    return blockir.parse(SOURCE.format(width=width), "source.block")


@pytest.mark.parametrize(("width", "expected"), [(64, (0.8, 0.2)), (4096, (0.8, 0.2)), (5120, (0.6, 0.15)),
                                                 (6144, (0.2, 0.05)), (8192, (0.2, 0.05))])
def test_alpha_by_width_and_site(width: int, expected: tuple[float, float]) -> None:
    assert dyt_llm_alpha(width) == expected


def test_recipe_sets_alpha_per_site_and_scales_the_embedding() -> None:
    result = dyt_llm.apply(_program(5120), "Layer")
    layer, model = result.program.block("Layer"), result.program.block("Model")
    alphas = {d.name: float(d.arg("alpha").value) for d in (*layer.decls, *model.decls) if d.kind == "dyt"}
    assert alphas == {"input_layernorm": 0.6, "post_attention_layernorm": 0.15, "norm": 0.15}
    assert blockir.verify(result.program) == []
    assert classify_program(result.program)["Layer"].topology == "dyt"
    m = blockir.compile(result.program, "Model", dims={"D": 16}, seed=0)
    assert m.embed_scale.item() == 4.0  # sqrt(D)
    assert m.layers[1].input_layernorm.alpha.item() == pytest.approx(0.6)


def test_recipe_refuses_a_norm_shared_by_attention_and_mlp() -> None:
    text = SOURCE.format(width=64).replace("mlp(post_attention_layernorm(h))", "mlp(input_layernorm(h))") \
        .replace("rmsnorm(D)\n  self_attn", "rmsnorm(D, tied=true)\n  self_attn")
    with pytest.raises(RecipeError, match="different alphas"):
        dyt_llm.apply(blockir.parse(text, "s.block"), "Layer")


def _dyt(x: Tensor, p: dict[str, Tensor], name: str) -> Tensor:
    return p[f"{name}.weight"] * torch.tanh(p[f"{name}.alpha"] * x) + p[f"{name}.bias"]


def _reference(x: Tensor, p: dict[str, Tensor]) -> Tensor:
    h = p["embed_scale"] * x
    for i in range(2):
        pre = f"layers.{i}"
        h = h + causal_attention(_dyt(h, p, f"{pre}.input_layernorm"), p, f"{pre}.self_attn", 4)
        inner = _dyt(h, p, f"{pre}.post_attention_layernorm")
        h = h + F.linear(F.gelu(F.linear(inner, p[f"{pre}.mlp.fc1.weight"], p[f"{pre}.mlp.fc1.bias"])),
                         p[f"{pre}.mlp.fc2.weight"], p[f"{pre}.mlp.fc2.bias"])
    return _dyt(h, p, "norm")


@pytest.mark.parametrize("backend", ["fx", "fused"])
def test_dyt_llm_model_is_its_equations(backend: str) -> None:
    result = dyt_llm.apply(_program(64), "Layer")
    m = blockir.compile(result.program, "Model", backend=backend, dims={"D": 16}, seed=0, dtype=torch.float64)
    assert_matches_reference(m, _reference, (2, 5, 16))


def test_generic_alpha_in_a_decoder_is_reported_and_the_recipe_output_is_not() -> None:
    text = SOURCE.format(width=4096).replace("rmsnorm(D)", "dyt(D, alpha=0.5)")
    diags = blockir.verify(blockir.parse(text, "s.block"))
    assert [(d.code, d.span.line) for d in diags] == [("E0443", 9)]
    assert blockir.verify(blockir.parse(text.replace("causal=true", "causal=false"), "s.block")) == []
