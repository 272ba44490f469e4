"""Verifiers see through calls: a bug is found whether it is written inline or inside a block instance."""
from __future__ import annotations

import blockir

HEAD = """dim B: batch
dim S: seq
dim T: seq
dim D: model = 16
dim F: hidden = 32
"""


def _found(source: str) -> list[tuple[str, int, str]]:
    return [(d.code, d.span.line, d.message) for d in blockir.verify(blockir.parse(HEAD + source, "t.block"))]


def _codes(source: str) -> list[tuple[str, int]]:
    return [(code, line) for code, line, _ in _found(source)]


def test_a_block_instance_holding_a_norm_applied_to_two_values_shares_the_norm() -> None:
    found = _found("""
block Sub(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  return n(x)
}

block A(x: [B, S, D]) -> [B, S, D] {
  s: Sub
  attn: self_attention(heads=2)
  f: mlp(F)
  h = x + attn(s(x))
  y = h + f(s(h))
  return y
}
""")
    assert found == [("E0307", 17, "block instance 's' (Sub) is applied to 'x' and to 'h': its norm 'n' is one "
                      "instance at two sites, which ties their learned scale")]


CROSS_SUB = """
block CrossSub(x: [B, T, D], memory: [B, S, D]) -> [B, T, D] {
  n: layernorm(D)
  ca: cross_attention(heads=2)
  y = x + ca(n(x), memory)
  return y
}
"""


def test_a_nested_cross_attention_sublayer_before_self_attention_is_out_of_order() -> None:
    found = _found(CROSS_SUB + """
block Dec(x: [B, T, D], memory: [B, S, D]) -> [B, T, D] {
  cross: CrossSub
  n1: layernorm(D)
  sa: self_attention(heads=2, causal=true)
  c = cross(x, memory)
  y = c + sa(n1(c))
  return y
}
""")
    assert [(c, line) for c, line, _ in found] == [("E0405", 19)]
    assert found[0][2] == ("decoder branches run in the order cross_attention, causal_self_attention: 'sa' "
                           "(causal_self_attention) comes after 'cross' (cross_attention)")


def test_a_decoder_whose_nested_sublayer_holds_non_causal_self_attention() -> None:
    found = _found(CROSS_SUB + """
block SelfSub(x: [B, T, D]) -> [B, T, D] {
  n: layernorm(D)
  sa: self_attention(heads=2, causal=false)
  y = x + sa(n(x))
  return y
}

block Dec(x: [B, T, D], memory: [B, S, D]) -> [B, T, D] {
  me: SelfSub
  cross: CrossSub
  h = me(x)
  y = cross(h, memory)
  return y
}
""")
    assert found == [("E0413", 24, "self-attention 'me.sa' of a decoder layer (it reads encoder memory through "
                      "'cross') is declared causal=false: each target row would see later targets")]


def test_a_decoder_only_block_passing_its_own_state_as_memory() -> None:
    found = _found(CROSS_SUB.replace("x: [B, T, D]", "x: [B, S, D]").replace("-> [B, T, D]", "-> [B, S, D]") + """
block Only(x: [B, S, D]) -> [B, S, D] {
  cross: CrossSub
  n: layernorm(D)
  y = cross(x, n(x))
  return y
}
""")
    assert [(c, line) for c, line, _ in found] == [("E0404", 17)]
    assert found[0][2].startswith("'cross' (CrossSub) reads encoder memory through cross-attention from its input "
                                  "'memory', but this block passes 'n(…)'")


def test_a_pre_ln_model_hiding_its_stack_behind_identity_needs_a_final_norm() -> None:
    found = _found("""
block L(x: [B, S, D]) -> [B, S, D] {
  n: rmsnorm(D)
  f: mlp(F)
  y = x + f(n(x))
  return y
}

model M(x: [B, S, D]) -> [B, S, D] {
  layers: L * 2
  return identity(layers(x))
}
""")
    assert [(c, line) for c, line, _ in found] == [("E0403", 16)]


def test_deepnorm_constants_see_cross_attention_in_a_nested_block() -> None:
    found = _found(CROSS_SUB + """
block DecLayer(x: [B, T, D], memory: [B, S, D]) -> [B, T, D] {
  const alpha = (2 * 6) ** 0.25
  sa: self_attention(heads=2, causal=true)
  n1: layernorm(D)
  cross: CrossSub
  f: mlp(F)
  n2: layernorm(D)
  h = n1(alpha * x + sa(x))
  c = cross(h, memory)
  y = n2(alpha * c + f(c))
  return y
}

model Decoder(x: [B, T, D], memory: [B, S, D]) -> [B, T, D] {
  layers: DecLayer * 6
  return layers(x, memory)
}
""")
    (code, _, message), = [f for f in found if f[0] == "E0410"]
    assert "the decoder of an encoder–decoder (it reads memory through cross-attention; M = 6)" in message


def test_a_dropout_helper_on_a_branch_output_is_legal_and_on_the_stream_is_not() -> None:
    helper = """
block Drop(x: [B, S, D]) -> [B, S, D] {
  return dropout(x, p=0.1)
}

block A(x: [B, S, D]) -> [B, S, D] {
  d: Drop
  n: layernorm(D)
  f: mlp(F)
  BODY
}
"""
    assert _codes(helper.replace("BODY", "y = x + d(f(n(x)))\n  return y")) == []
    found = _found(helper.replace("BODY", "h = d(x)\n  y = h + f(n(h))\n  return y"))
    assert found == [("E0402", 15, "'d' (Drop) applies dropout to the residual state it is given, not to a branch "
                      "update")]


def test_pre_and_post_norms_on_every_update_are_one_placement() -> None:
    assert _codes("""
block Sandwich(x: [B, S, D]) -> [B, S, D] {
  pre1: layernorm(D)
  post1: layernorm(D)
  attn: self_attention(heads=2)
  pre2: layernorm(D)
  post2: layernorm(D)
  mlp: mlp(F)
  h = post1(x + attn(pre1(x)))
  y = post2(h + mlp(pre2(h)))
  return y
}
""") == []


def test_a_post_ln_layer_with_a_separate_gain_ends_normalized() -> None:
    assert _codes("""
block L(x: [B, S, D]) -> [B, S, D] {
  ln: layernorm(D, affine=false, bias=false)
  g: vector(D)
  attn: self_attention(heads=2)
  y = g * ln(x + attn(x))
  return y
}

model M(x: [B, S, D]) -> [B, S, D] {
  layers: L * 2
  return layers(x)
}
""") == []


# A Pre-LN layer (two un-normalized updates) that normalizes what it returns: the next holder of the stream
# would continue from a norm's output, the wiring of a fused add+norm's normalized output passed on as the
# residual. Lines of HEAD + PRE: the layer's first add is on line 12.
PRE = """block Pre(x: [B, S, D]) -> [B, S, D] {
  ln: layernorm(D)
  mlp: mlp(F)
  ln2: layernorm(D)
  mlp2: mlp(F)
  out: layernorm(D)
  h = x + mlp(ln(x))
  y = h + mlp2(ln2(h))
  return out(y)
}
"""


def _continued(model: str) -> list[tuple[str, int, str]]:
    return [(c, line, m) for c, line, m in _found(PRE + model) if c == "E0412"]


def test_a_stack_whose_layers_end_normalized_continues_from_a_norm() -> None:
    assert _continued("model M(x: [B, S, D]) -> [B, S, D] {\n  layers: Pre * 3\n  return layers(x)\n}\n") == [
        ("E0412", 18, "each layer of 'layers' returns a norm's output, and the next layer continues it as the "
                      "residual stream: the stream continues from a normalized value")]
    # one layer hands its normalized result to nobody that continues it
    assert _continued("model M(x: [B, S, D]) -> [B, S, D] {\n  layers: Pre * 1\n  return layers(x)\n}\n") == []


def test_a_normalized_value_handed_to_a_block_that_continues_it() -> None:
    assert _continued("model M(x: [B, S, D]) -> [B, S, D] {\n  n: layernorm(D)\n  one: Pre\n"
                      "  return one(n(x))\n}\n") == [
        ("E0412", 19, "'one' continues its first input as the residual stream, but is handed the normalized output "
                      "of 'n': the stream continues from a normalized value")]
    assert _continued("model M(x: [B, S, D]) -> [B, S, D] {\n  a: Pre\n  b: Pre\n  return b(a(x))\n}\n") == [
        ("E0412", 19, "'b' continues its first input as the residual stream, but is handed the result of 'a', which "
                      "ends with a norm: the stream continues from a normalized value")]


def test_an_update_continuing_a_call_that_ends_normalized() -> None:
    add = "model M(x: [B, S, D]) -> [B, S, D] {\n  one: Pre\n  m: mlp(F)\n  h = one(x)\n  y = {}\n  return y\n}\n"
    assert _continued(add.replace("{}", "h + m(h)")) == [
        ("E0412", 20, "the shortcut of this add is the result of 'one', which ends with a norm: the residual stream "
                      "continues from a normalized value")]
    # normalizing the sum is Post-LN; stating the wiring accepts it
    assert _continued(add.replace("m: mlp(F)", "m: mlp(F)\n  n: layernorm(D)").replace("{}", "n(h + m(h))")) == []
    stated = PRE.replace("  ln: layernorm(D)", "  const residual_from_norm = 1\n  ln: layernorm(D)")
    assert _found(stated + "model M(x: [B, S, D]) -> [B, S, D] {\n  layers: Pre * 3\n  return layers(x)\n}\n") == []


def test_a_stated_stack_of_normalized_layers_inlines_into_a_block_that_states_it_too() -> None:
    """The fused backend writes the stack out flat: the permission the layer states travels with its updates."""
    import torch
    stated = PRE.replace("  ln: layernorm(D)", "  const residual_from_norm = 1\n  ln: layernorm(D)")
    program = blockir.parse(HEAD + stated + "model M(x: [B, S, D]) -> [B, S, D] {\n  layers: Pre * 3\n"
                            "  return layers(x)\n}\n", "t.block")
    fx = blockir.compile(program, "M", dims={"B": 2, "S": 4}, seed=0)
    fused = blockir.compile(program, "M", backend="fused", dims={"B": 2, "S": 4}, seed=0)
    fused.load_state_dict(fx.state_dict(), strict=True)
    x = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(fused(x), fx(x), rtol=1e-6, atol=1e-6)


def test_a_stream_that_begins_normalized_does_not_continue_from_a_norm() -> None:
    """BLOOM normalizes its embeddings before the first layer: the stream starts at that norm's output. A Pre-LN
    stack may take it, in the file as written and in the flat copy the fused backend builds."""
    import torch
    layer = PRE.replace("  out: layernorm(D)\n", "").replace("  return out(y)", "  return y")
    model = ("dim V: vocab = 32\nmodel M(ids: [B, S]) -> [B, S, D] {\n  embed: embedding(V, D)\n"
             "  embed_norm: layernorm(D)\n  layers: Pre * 2\n  norm: layernorm(D)\n"
             "  return norm(layers(embed_norm(embed(ids))))\n}\n")
    assert _found(layer + model) == []
    program = blockir.parse(HEAD + layer + model, "t.block")
    fx = blockir.compile(program, "M", dims={"B": 2, "S": 4}, seed=0)
    fused = blockir.compile(program, "M", backend="fused", dims={"B": 2, "S": 4}, seed=0)
    fused.load_state_dict(fx.state_dict(), strict=True)
    ids = torch.randint(0, 32, (2, 4), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(fused(ids), fx(ids), rtol=1e-6, atol=1e-6)


def test_what_a_caller_reads_about_the_identity_route() -> None:
    from blockir.analyses.summaries import summaries

    program = blockir.parse(HEAD + """dim V: vocab = 32

block Scale(x: [B, S, D]) -> [B, S, D] {
  return dropout(0.5 * x, p=0.1)
}

block Twice(x: [B, S, D]) -> [B, S, D] {
  s: Scale
  return 3 * s(x)
}

block Sub(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  f: mlp(F)
  return x + f(n(x))
}

block Post(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  f: mlp(F)
  return n(x + f(x))
}

block Plain(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  f: mlp(F)
  return f(n(x))
}

block Head(x: [B, S, D]) -> [B, S, V] {
  lm_head: head(V)
  return lm_head(x)
}
""", "t.block")
    facts = summaries(program)
    twice = facts["Twice"].passes_input
    assert twice is not None and twice.factor == 1.5 and twice.dropout is not None and twice.dropout.line == 9
    assert facts["Sub"].passes_input is None and facts["Sub"].identity_route.line == 20  # type: ignore[union-attr]
    assert facts["Post"].identity_route is None and facts["Post"].carries and facts["Post"].replaces_state is None
    assert not facts["Plain"].carries and facts["Plain"].replaces_state.path == "f"  # type: ignore[union-attr]
    assert facts["Head"].raw_head.path == "lm_head" and facts["Sub"].raw_head is None  # type: ignore[union-attr]
