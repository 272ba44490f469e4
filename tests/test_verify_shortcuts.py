"""The identity route of every update, seen through calls: counted twice (E0446), missing (E0447), scaled by a
constant no recipe declares (W0403), dropped inside a helper (E0401); a head fed by an unnormalized Pre-LN stack
(E0403); DeepNorm and T-Fixup constants in nested blocks (E0410, E0445). Exact diagnostics, and none on the
recipes and models that do these things on purpose."""
from __future__ import annotations

import blockir
from blockir.passes.fuse import fuse_program

HEAD = """dim B: batch
dim S: seq
dim T: seq
dim D: model = 64
dim F: hidden = 256
dim H: heads = 4
dim V: vocab = 128
"""


def findings(body: str) -> list[tuple[str, str, int, int]]:
    text = HEAD + body
    return [(d.code, d.message, d.span.line - HEAD.count("\n"), d.span.column)
            for d in blockir.verify(blockir.parse(text, "t.block"))]


def codes(body: str) -> list[str]:
    return [c for c, *_ in findings(body)]


HALF = """block Half(x: [B, S, D]) -> [B, S, D] {
  return 0.5 * x
}
"""


def test_the_state_again_through_a_scaling_helper_counts_the_shortcut_twice() -> None:
    assert findings(HALF + """
block L(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  f: mlp(F)
  shrink: Half
  y = x + shrink(x) + f(n(x))
  return y
}
""") == [("E0446", "the shortcut is counted twice: the state 'x' enters this residual sum twice (as 'x' and as "
                   "'shrink(…)')", 9, 7)]


def test_a_residual_block_as_a_branch_counts_the_shortcut_twice_through_two_instances() -> None:
    found = findings("""
block Sub(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  f: mlp(F)
  return x + f(n(x))
}

block Wrap(x: [B, S, D]) -> [B, S, D] {
  inner: Sub
  return inner(x)
}

block L(x: [B, S, D]) -> [B, S, D] {
  w: Wrap
  y = x + dropout(w(x), p=0.1)
  return y
}
""")
    assert [(c, line, col) for c, _, line, col in found] == [("E0446", 15, 19)]
    assert found[0][1].startswith("the shortcut is counted twice: the branch 'w' (Wrap) already returns its input")


def test_a_residual_block_handed_a_normalized_value_is_not_a_second_shortcut() -> None:
    # x + sub(n(x)) adds n(x) + f(…): the stream continues from a norm (E0412), the state is added once
    assert codes("""
block Sub(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  f: mlp(F)
  return x + f(n(x))
}

block L(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  sub: Sub
  y = x + sub(n(x))
  return y
}
""") == ["E0412"]


def test_an_add_of_two_branches_has_no_shortcut() -> None:
    assert findings("""
block L(x: [B, S, D]) -> [B, S, D] {
  n1: layernorm(D)
  attn: self_attention(heads=H)
  n2: layernorm(D)
  f: mlp(F)
  y = attn(n1(x)) + f(n2(x))
  return y
}
""") == [("E0447", "this residual add has no shortcut: none of its operands carries the state 'x' forward, so the "
                   "update replaces the state", 7, 7)]


def test_a_models_embedding_sum_and_head_transform_are_not_updates() -> None:
    assert findings("""
block L(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  f: mlp(F)
  return x + f(n(x))
}

model M(ids: [B, S], pos: [B, S]) -> [B, S, V] {
  tok: embedding(V, D)
  wpe: embedding(V, D)
  layers: L * 2
  norm: layernorm(D)
  dense: linear(D, D)
  act: activation(fn=gelu)
  ln: layernorm(D)
  lm_head: head(V)
  return lm_head(ln(act(dense(norm(layers(tok(ids) + wpe(pos)))))))
}
""") == []


def test_a_stack_of_a_block_that_only_calls_a_plain_block_replaces_its_input() -> None:
    found = findings("""
block Ffn(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  f: mlp(F)
  return f(n(x))
}

block Layer(x: [B, S, D]) -> [B, S, D] {
  ffn: Ffn
  return ffn(x)
}

model M(x: [B, S, D]) -> [B, S, D] {
  layers: Layer * 3
  norm: layernorm(D)
  return norm(layers(x))
}
""")
    assert [(c, line, col) for c, _, line, col in found] == [("E0447", 16, 15)]


def test_constant_shortcuts_a_recipe_declares_are_clean() -> None:
    post = """
block L(x: [B, S, D]) -> [B, S, D] {{
{const}  attn: self_attention(heads=H, causal=true)
  ln: layernorm(D)
  y = ln({alpha} * x + attn(x))
  return y
}}

model M(x: [B, S, D]) -> [B, S, D] {{
  layers: L * 6
  return layers(x)
}}
"""
    assert codes(post.format(const="", alpha="(2 * num_layers) ** 0.25")) == []  # DeepNorm's alpha, L = 6
    assert codes(post.format(const="  const scaled_shortcut = 1\n", alpha="1.5")) == []
    assert findings(post.format(const="", alpha="1.5")) == [
        ("W0403", "the shortcut of this residual add is 'x' times the constant 1.5, and no recipe declares it: across "
                  "a stack the direct route is scaled by the product of these constants", 5, 10)]
    assert codes(post.format(const="", alpha="1")) == []


def test_deepscalelm_stays_clean_after_fusion() -> None:
    program = blockir.parse(open("examples/deepscalelm.block").read(), "examples/deepscalelm.block")
    assert blockir.verify(program) == []
    fused, changed = fuse_program(program)
    assert changed and blockir.verify(fused) == []


def test_a_head_with_its_final_norm_and_a_stated_head_norm_are_clean() -> None:
    model = """
block L(x: [B, S, D]) -> [B, S, D] {{
  n: rmsnorm(D)
  f: gated_mlp(F)
  return x + f(n(x))
}}

model M(ids: [B, S]) -> [B, S, V] {{
{const}  embed: embedding(V, D)
  layers: L * 2
{norm}  lm_head: head(V)
  return {out}
}}
"""
    norm = "  norm: rmsnorm(D)\n"
    assert codes(model.format(const="", norm=norm, out="0.5 * lm_head(norm(layers(embed(ids))))")) == []
    assert codes(model.format(const="  const final_norm = 1\n", norm=norm, out="lm_head(norm(layers(embed(ids))))")) \
        == []
    assert codes(model.format(const="  const final_norm = 0\n", norm="", out="lm_head(layers(embed(ids)))")) == []
    assert codes(model.format(const="", norm="", out="lm_head(layers(embed(ids)))")) == ["E0403"]


CROSS = """
block Cross(x: [B, T, D], memory: [B, S, D]) -> [B, T, D] {{
{consts}  src: cross_attention(heads=H{gain})
  ln: {norm}
  y = {sum}
  return y
}}
"""


def test_deepnorm_constants_of_a_nested_cross_sublayer_written_for_the_stack_are_clean() -> None:
    body = """
const M = 6
""" + CROSS.format(consts="  const alpha = (3 * M) ** 0.25\n  const beta = (12 * M) ** (-0.25)\n",
                   gain=", init_gain=beta", norm="layernorm(D)", sum="ln(alpha * x + src(x, memory))") + """
block Dec(x: [B, T, D], memory: [B, S, D]) -> [B, T, D] {
  const alpha = (3 * num_layers) ** 0.25
  const beta = (12 * num_layers) ** (-0.25)
  sa: self_attention(heads=H, causal=true, init_gain=beta)
  ln: layernorm(D)
  cross: Cross
  h = ln(alpha * x + sa(x))
  return cross(h, memory)
}

model Decoder(x: [B, T, D], memory: [B, S, D]) -> [B, T, D] {
  layers: Dec * M
  return layers(x, memory)
}
"""
    assert codes(body) == []
    found = findings(body.replace("(12 * M) ** (-0.25)\n  src", "(12 * num_layers) ** (-0.25)\n  src"))
    assert [(c, line) for c, _, line, _ in found] == [("E0410", 7)]
    assert "reads num_layers = 1: 'Cross' is instanced once inside 'Dec'" in found[0][1]
    assert found[0][1].endswith("stacked 6 times; beta should be 0.343295")


def test_tfixup_sees_the_norm_and_gain_of_a_nested_cross_attention() -> None:
    layer = CROSS.format(consts="", gain=", init_gain=GAIN", norm="layernorm(D)", sum="x + src(ln(x), memory)") + """
block Dec(x: [B, T, D], memory: [B, S, D]) -> [B, T, D] {
  const tfixup = 1
  sa: self_attention(heads=H, causal=true, init_gain=(9 * num_layers) ** (-0.25))
  cross: Cross
  h = x + sa(x)
  return cross(h, memory)
}

model Decoder(x: [B, T, D], memory: [B, S, D]) -> [B, T, D] {
  layers: Dec * 6
  return layers(x, memory)
}
"""
    found = findings(layer.replace("GAIN", "(9 * num_layers) ** (-0.25)"))
    assert [(c, m) for c, m, _, _ in found if c == "E0445"] == [
        ("E0445", "init_gain of 'src' is 0.57735 in a 6-layer stack, but T-Fixup's scale is 0.368894 (decoder)"),
        ("E0445", "'Dec' states tfixup = 1, which runs 'Cross', but keeps norm 'ln'")]
    clean = layer.replace("GAIN", "(9 * 6) ** (-0.25)").replace("x + src(ln(x), memory)", "x + src(x, memory)")
    assert codes(clean.replace("  ln: layernorm(D)\n", "")) == []


def test_no_imported_family_reports_anything() -> None:
    from test_import_hf import CONFIGS as DECODERS  # the families the import tests compare with transformers
    from test_import_hf_more import CONFIGS as OTHERS
    from blockir.api import hf_block_text as block_text

    configs = {**DECODERS, **{f"more:{k}": v for k, v in OTHERS.items()}}
    assert len(configs) >= 46
    found = {k: [d.code for d in blockir.verify(blockir.parse(block_text(c), k))] for k, c in configs.items()}
    assert {k: v for k, v in found.items() if v} == {}
