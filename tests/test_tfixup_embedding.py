"""T-Fixup's input embedding (Huang et al., 2020): a model stacking the recipe's block draws its token table from
N(0, d^(-1/2)) and scales it by (9N)^(-1/4); a model that states the block's tfixup = 1 without that is E0445."""
from __future__ import annotations

import pytest
import torch

import blockir
from blockir.ir.printer import format_program
from blockir.passes.recipes import tfixup

SOURCE = """dim B: batch
dim S: seq
dim D: model = 64
dim F: hidden = 128
dim V: vocab = 512

block Layer(x: [B, S, D]) -> [B, S, D] {
  attn: self_attention(heads=4, causal=true)
  ln_1: layernorm(D)
  mlp: mlp(F)
  ln_2: layernorm(D)
  h = ln_1(x + attn(x))
  y = ln_2(h + mlp(h))
  return y
}

model LM(input_ids: [B, S]) -> [B, S, V] {
  embed: embedding(V, D)
  layers: Layer * 6
  lm_head: head(V)
  return lm_head(layers(embed(input_ids)))
}
"""


@pytest.fixture(scope="module")
def program() -> blockir.Program:
    return tfixup.apply(blockir.parse(SOURCE, "lm.block"), "Layer").program


def test_the_embedding_is_drawn_at_the_papers_scale(program: blockir.Program) -> None:
    """std = d^(-1/2) (9N)^(-1/4) for d = 64, N = 6, over 512 x 64 draws (a relative error of the std of
    about 1/sqrt(2 n) = 0.4%); the draws are centred."""
    w = blockir.compile(program, "LM", seed=0, dtype=torch.float64).state_dict()["embed.weight"]
    want = 64 ** -0.5 * (9 * 6) ** -0.25
    assert w.std().item() == pytest.approx(want, rel=0.02)
    assert abs(w.mean().item()) < 3 * want / w.numel() ** 0.5
    assert blockir.verify(program) == []


def test_an_embedding_left_at_its_default_is_an_error(program: blockir.Program) -> None:
    text = format_program(program).replace(", init_std=D ** (-0.5), init_gain=(9 * 6) ** (-0.25)", "")
    diags = blockir.verify(blockir.parse(text, "lm.block"))
    assert [(d.code, d.message) for d in diags] == [(
        "E0445", "'LM' stacks 'Layer', which states tfixup = 1, but its token embedding 'embed' is not T-Fixup's "
        "N(0, d^(-1/2)) scaled by (9N)^(-1/4) for N = 6: init_std is unset, not 0.125; init_gain is unset, not "
        "0.368894")]
