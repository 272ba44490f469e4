"""topology and classify verifiers: exact diagnostics for every code, stated facts, fused IR."""
from __future__ import annotations

from pathlib import Path

import pytest

import blockir
from blockir.passes.fuse import fuse_program
from conftest import EXAMPLES

HEAD = """dim B: batch
dim S: seq
dim T: seq
dim D: model = 64
dim F: hidden = 256
dim H: heads = 4
"""


def findings(body: str) -> list[tuple[str, str, int, int]]:
    text = HEAD + body
    return [(d.code, d.message, d.span.line - HEAD.count("\n"), d.span.column)
            for d in blockir.verify(blockir.parse(text, "t.block"))]


PRE_LN = """block L(x: [B, S, D]) -> [B, S, D] {{
{consts}  n1: layernorm(D)
  attn: self_attention(heads=H)
  n2: layernorm(D)
  mlp: mlp(F)
  h = x + attn(n1(x))
  y = h + mlp(n2(h))
  return y
}}
"""
POST_LN = """block L(x: [B, S, D]) -> [B, S, D] {{
{consts}  n1: layernorm(D)
  attn: self_attention(heads=H)
  n2: layernorm(D)
  mlp: mlp(F)
  h = n1(x + attn(x))
  y = n2(h + mlp(h))
  return y
}}
"""


def test_e0401_dropout_on_the_shortcut() -> None:
    assert findings("""block L(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  f: extern(x: [B, S, D]) -> [B, S, D]
  y = drop_path(x, p=0.1) + f(n(x))
  return y
}
""") == [("E0401", "dropout on the identity path: the shortcut 'x' of this residual add is dropped", 4, 7)]


def test_e0402_dropout_on_the_stream() -> None:
    assert findings("""block L(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  f: extern(x: [B, S, D]) -> [B, S, D]
  d = dropout(x, p=0.1)
  y = d + f(n(d))
  return y
}
""") == [("E0402", "dropout on the residual state drops 'x' itself, not a branch update", 4, 7)]


def test_dropout_on_the_embedding_lookups_is_where_the_stream_begins() -> None:
    model = """block L(x: [B, S, D]) -> [B, S, D] {{
  n: layernorm(D)
  f: extern(x: [B, S, D]) -> [B, S, D]
  y = x + f(n(x))
  return y
}}
model M(ids: [B, S]) -> [B, S, V] {{
  wte: embedding(V, D)
  wpe: embedding(P, D, positions=true)
  layers: L * 2
  n: layernorm(D)
  lm_head: head(V, tied=true)
  e = {embedded}
  return lm_head(n(layers(e)))
}}
"""
    sizes = "dim V: vocab = 64\ndim P: vocab = 16\n"
    assert findings(sizes + model.format(embedded="dropout(wte(ids) + wpe(ids), p=0.1)")) == []
    # the same dropout after the stack's first update is on the residual state
    after = findings(sizes + model.format(embedded="dropout(layers(wte(ids) + wpe(ids)), p=0.1)"))
    assert [f[:2] for f in after if f[0] == "E0402"] == [
        ("E0402", "dropout on the residual state drops 'layers(…)' itself, not a branch update")]


def test_zero_probability_dropout_is_not_a_misplaced_dropout() -> None:
    assert findings("""block L(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  f: extern(x: [B, S, D]) -> [B, S, D]
  y = dropout(x + f(n(x)), p=0)
  return y
}
""") == []


def model(member: str, body: str, consts: str = "") -> str:
    return member + f"model M(x: [B, S, D]) -> [B, S, D] {{\n{consts}  layers: L * 4\n{body}}}\n"


def test_e0403_pre_ln_stack_without_final_norm() -> None:
    assert findings(model(PRE_LN.format(consts=""), "  return layers(x)\n")) == [
        ("E0403", "model 'M' returns the output of 'layers' (L) without a final norm, but 'L' leaves its last "
         "residual add unnormalized", 12, 3)]


def test_final_norm_rules() -> None:
    with_norm = "  norm: layernorm(D)\n  return norm(layers(x))\n"
    assert findings(model(PRE_LN.format(consts=""), with_norm)) == []
    assert findings(model(POST_LN.format(consts=""), "  return layers(x)\n")) == []
    assert findings(model(PRE_LN.format(consts=""), "  return layers(x)\n", "  const final_norm = 0\n")) == []
    assert findings(model(PRE_LN.format(consts=""), with_norm, "  const final_norm = 0\n")) == [
        ("E0407", "'M' states final_norm = 0, but it returns the output of norm 'norm'", 14, 10)]
    assert findings(model(POST_LN.format(consts=""), "  return layers(x)\n", "  const final_norm = 1\n")) == [
        ("E0407", "'M' states final_norm = 1, but its output is not normalized", 13, 3)]


def test_e0404_cross_attention_without_memory() -> None:
    assert findings("""block L(x: [B, S, D]) -> [B, S, D] {
  n: rmsnorm(D)
  cross: cross_attention(heads=H)
  y = x + cross(n(x), x)
  return y
}
""") == [("E0404", "cross-attention 'cross' reads its keys and values from 'x', which comes from the block's own "
          "state: a decoder-only block has no encoder memory", 4, 11)]


def test_e0405_decoder_order() -> None:
    assert findings("""block L(x: [B, T, D], m: [B, S, D]) -> [B, T, D] {
  n1: layernorm(D)
  attn: self_attention(heads=H)
  n2: layernorm(D)
  src: cross_attention(heads=H)
  n3: layernorm(D)
  ffn: mlp(F)
  h = x + attn(n1(x))
  c = h + ffn(n2(h))
  y = c + src(n3(c), m)
  return y
}
""") == [("E0405", "decoder branches run in the order causal_self_attention, mlp, cross_attention: 'src' "
          "(cross_attention) comes after 'ffn' (mlp)", 10, 11)]


def test_e0406_different_views_for_q_k_v() -> None:
    assert findings("""block L(x: [B, S, D]) -> [B, S, D] {
  n1: layernorm(D)
  n2: layernorm(D)
  attn: extern(q: [B, S, D], k: [B, S, D], v: [B, S, D]) -> [B, S, D]
  y = x + attn(n1(x), n2(x), n1(x))
  return y
}
""") == [("E0406", "'attn' reads different views of 'x': 'n1(…)' and 'n2(…)' (argument 2)", 5, 11)]


def test_e0407_norm_first_and_parallel_residual() -> None:
    assert findings(POST_LN.format(consts="  const norm_first = 1\n")) == [
        ("E0407", "'L' states norm_first = 1 (Pre-LN: every branch reads a normalized state), but this update "
         "normalizes the residual sum", 7, 10)]
    assert findings(PRE_LN.format(consts="  const norm_first = 1\n")) == []
    assert findings(PRE_LN.format(consts="  const parallel_residual = 1\n")) == [
        ("E0407", "'L' states parallel_residual = 1 (all branches read the same state and join one add), but this "
         "update updates the state one branch after another", 7, 7)]
    assert findings("""block L(x: [B, S, D]) -> [B, S, D] {
  const parallel_residual = 0
  n1: layernorm(D)
  n2: layernorm(D)
  attn: self_attention(heads=H)
  mlp: mlp(F)
  y = x + attn(n1(x)) + mlp(n2(x))
  return y
}
""") == [("E0407", "'L' states parallel_residual = 0 (branches update the state one after another), but this "
          "update joins 2 branches in one add", 7, 7)]


def test_e0408_fact_value() -> None:
    assert findings(PRE_LN.format(consts="  const norm_first = 2\n")) == [
        ("E0408", "'norm_first' states a fact and must be 0 or 1, got 2", 2, 9)]


def test_e0409_and_w0402_shortcut_changes() -> None:
    assert findings("""block L(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  f: extern(x: [B, S, D]) -> [B, S, D]
  p: linear(D, D, bias=false)
  g: scalar(init=1)
  h = p(x) + f(n(x))
  y = g * h + f(n(h))
  return y
}
""") == [("E0409", "the shortcut passes through the projection 'p' (D -> D): the identity path no longer carries the "
          "state unchanged", 6, 7),
         ("W0402", "the shortcut is gated by the learned scalar 'g': the direct route across this add is a trained "
          "scale, not the identity", 7, 7),
         ("E0307", "layernorm 'n' is applied to 'x' and to 'h': one instance at two sites ties their learned scale",
          7, 17)]


DEEPNORM = """block L(x: [B, S, D]) -> [B, S, D] {{
  const alpha = {alpha}
  attn: self_attention(heads=H)
  n1: layernorm(D)
  h = n1(alpha * x + attn(x))
  return h
}}

block Dec(x: [B, T, D], m: [B, S, D]) -> [B, T, D] {{
  src: cross_attention(heads=H)
  n1: layernorm(D)
  h = n1(x + src(x, m))
  return h
}}

model Enc(x: [B, S, D]) -> [B, S, D] {{
  layers: L * 6
  return layers(x)
}}

model DecM(x: [B, T, D], m: [B, S, D]) -> [B, T, D] {{
  layers: Dec * 12
  return layers(x, m)
}}
"""


def test_e0410_deepnorm_encoder_of_an_encoder_decoder() -> None:
    # N = 6 encoder layers, M = 12 decoder layers: alpha_e = 0.81 (N^4 M)^(1/16)
    assert findings(DEEPNORM.format(alpha="(2 * num_layers) ** 0.25")) == [
        ("E0410", "DeepNorm alpha = 1.86121 follows the encoder-only / decoder-only row, (2L)^(1/4) and (8L)^(-1/4), "
         "but 'L' is the encoder of an encoder–decoder (N = 6, M = 12): alpha should be 1.48072", 5, 10)]
    assert findings(DEEPNORM.format(alpha="0.81 * (num_layers ** 4 * 12) ** (1 / 16)")) == []


def test_e0411_dropout_in_an_evaluated_block() -> None:
    evaluated = PRE_LN.format(consts="  const training = 0\n").replace("attn(n1(x))", "dropout(attn(n1(x)), p=0.2)")
    assert findings(evaluated) == [
        ("E0411", "dropout with p=0.2 in 'L', which states training = 0: an evaluated block must be deterministic",
         7, 11)]


def test_e0412_normalized_value_as_the_shortcut() -> None:
    assert findings("""block L(x: [B, S, D]) -> [B, S, D] {
  n: rmsnorm(D)
  f: extern(x: [B, S, D]) -> [B, S, D]
  y = n(x) + f(x)
  return y
}
""") == [("E0412", "the shortcut of this add is 'n(…)', the normalized output of 'n': the residual stream continues "
          "from a normalized value", 4, 7)]


def test_e0413_decoder_self_attention_not_causal() -> None:
    assert findings("""block L(x: [B, T, D], m: [B, S, D]) -> [B, T, D] {
  attn: self_attention(heads=H, causal=false)
  src: cross_attention(heads=H)
  n1: layernorm(D)
  n2: layernorm(D)
  h = x + attn(n1(x))
  y = h + src(n2(h), m)
  return y
}
""") == [("E0413", "self-attention 'attn' of a decoder layer (it reads encoder memory through 'src') is declared "
          "causal=false: each target row would see later targets", 2, 3)]


def test_w0401_mixed_placement_unless_stated() -> None:
    mixed = """block L(x: [B, S, D]) -> [B, S, D] {
  n1: layernorm(D)
  attn: self_attention(heads=H)
  n2: layernorm(D)
  mlp: mlp(F)
  h = x + attn(n1(x))
  y = n2(h + mlp(h))
  return y
}
"""
    assert findings(mixed) == [
        ("W0401", "updates of 'L' disagree on norm placement: 'attn' is pre, 'mlp' is post", 7, 10)]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_and_its_fused_form_verify_clean(path: Path) -> None:
    program = blockir.parse(path.read_text(), str(path))
    assert blockir.verify(program) == []
    fused, _ = fuse_program(program)
    assert blockir.verify(fused) == []


def test_a_head_reading_the_normalized_output_of_a_fused_add_norm_reads_a_final_norm() -> None:
    """Fusing the last residual add into the final norm keeps ``final_norm = 1`` true."""
    text = HEAD + """dim V: vocab = 32

model M(x: [B, S, D]) -> [B, S, V] {
  const final_norm = 1
  n: rmsnorm(D, accum=f32)
  f: mlp(F)
  ln_f: rmsnorm(D, accum=f32)
  lm_head: head(V)
  h = x + f(n(x))
  return lm_head(ln_f(h))
}
"""
    fused, changed = fuse_program(blockir.parse(text, "t.block"))
    assert changed
    assert [d.code for d in blockir.verify(fused) if d.is_error] == []


def test_fixup_reports_a_norm_fused_into_an_add_as_a_kept_norm() -> None:
    """Fusing a norm into the add before it does not hide it from ``fixup = 1``: the same errors before and after."""
    text = HEAD + """
block CalledFixup(x: [B, S, D]) -> [B, S, D] {
  const fixup = 1
  ln_1: rmsnorm(D, accum=f32)
  self_attn: self_attention(heads=H, causal=true)
  ln_2: rmsnorm(D, accum=f32)
  mlp: mlp(F, act=relu)
  h = x + self_attn(ln_1(x))
  y = h + mlp(ln_2(h))
  return y
}
"""
    program = blockir.parse(text, "t.block")
    fused, changed = fuse_program(program)
    assert changed
    found = [(d.code, d.message) for d in blockir.verify(fused) if d.code == "E0442"]
    assert found == [(d.code, d.message) for d in blockir.verify(program) if d.code == "E0442"]
    assert [m for _, m in found] == [
        "'CalledFixup' states fixup = 1 but branch 'self_attn' keeps norm 'ln_1' and has no scalar multiplier "
        "(scalar(init=1)) and has no scalar biases before its first weight layer and after its multiplier "
        "(bias(init=0)) and has no scalar biases inside 'self_attn' (fixup_bias=true)",
        "'CalledFixup' states fixup = 1 but branch 'mlp' keeps norm 'ln_2' and has no scalar multiplier "
        "(scalar(init=1)) and has no scalar biases before its first weight layer and after its multiplier "
        "(bias(init=0)) and has no scalar biases inside 'mlp' (fixup_bias=true)"]
