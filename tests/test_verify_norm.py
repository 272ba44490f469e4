"""norm-contract: exact diagnostics for every code, and what stays silent."""
from __future__ import annotations

import dataclasses

import blockir
from blockir.ir.consts import Bin, Name, Num

HEAD = """dim B: batch
dim S: seq
dim D: model = 64
dim F: hidden = 256
dim H: heads = 4
"""


def findings(body: str) -> list[tuple[str, str, int, int]]:
    text = HEAD + body
    return [(d.code, d.message, d.span.line - HEAD.count("\n"), d.span.column)
            for d in blockir.verify(blockir.parse(text, "t.block"))]


def layer(norm: str, x: str = "[B, S, D]") -> str:
    return f"""block A(x: {x}) -> {x} {{
  n: {norm}
  f: extern(x: {x}) -> {x}
  y = x + f(n(x))
  return y
}}
"""


def test_e0301_sequence_and_batch_axes() -> None:
    assert findings(layer("layernorm(S)")) == [
        ("E0301", "layernorm 'n' reduces over S, a sequence axis: its statistics would mix the tokens of each "
         "sequence", 2, 3)]
    assert findings(layer("rmsnorm(B)")) == [
        ("E0301", "rmsnorm 'n' reduces over B, a batch axis: its statistics would mix the examples of each batch",
         2, 3)]


def test_e0302_whole_sentence() -> None:
    assert findings(layer("layernorm([S, D])")) == [
        ("E0302", "layernorm 'n' reduces over [S, D] as one sample: its statistics are [B, 1, 1], not one per row "
         "[B, S, 1]", 2, 3)]


def test_e0303_axis_missing_from_the_input() -> None:
    assert findings("""block A(x: [B, S, D]) -> [B, S, D] {
  up: linear(D, F)
  n: layernorm(D)
  down: linear(F, D)
  y = x + down(n(up(x)))
  return y
}
""") == [("E0303", "layernorm 'n' reduces over [D], but its input 'up(…)' is [B, S, F]", 5, 16)]


def test_a_norm_over_a_hidden_axis_inside_a_branch_is_fine() -> None:
    assert findings("""block A(x: [B, S, D]) -> [B, S, D] {
  up: linear(D, F)
  n: layernorm(F)
  down: linear(F, D)
  y = x + down(n(gelu(up(x))))
  return y
}
""") == []


def test_e0304_eps_not_positive_in_some_layer() -> None:
    # the parser rejects a literal eps <= 0 (E0110); a rewritten program can still carry one per layer
    text = HEAD + layer("layernorm(D, eps=1e-5)") + "model M(x: [B, S, D]) -> [B, S, D] {\n  layers: A * 3\n" \
        "  n: layernorm(D)\n  return n(layers(x))\n}\n"
    program = blockir.parse(text, "t.block")
    block = program.block("A")
    decl = block.decl_map["n"]
    eps = Bin("-", Num(1e-5), Bin("*", Name("layer"), Num(1e-5)))  # 1e-5, 0, -1e-5
    args = tuple((k, eps if k == "eps" else v) for k, v in decl.args)
    block = dataclasses.replace(block, decls=(dataclasses.replace(decl, args=args),) + block.decls[1:])
    program = dataclasses.replace(program, blocks=(block,) + program.blocks[1:])
    assert [(d.code, d.message) for d in blockir.verify(program) if d.code == "E0304"] == [
        ("E0304", "eps of layernorm 'n' is 0.0 in layer 1 of 3; it must be > 0")]


def test_e0305_layernorm_without_centering() -> None:
    assert findings(layer("layernorm(D, center=false)")) == [
        ("E0305", "layernorm 'n' has center=false: without centering it divides by the RMS, which is an RMSNorm",
         2, 3)]


def test_e0306_bias_on_rmsnorm() -> None:
    assert findings(layer("rmsnorm(D, bias=true)")) == [
        ("E0306", "rmsnorm 'n' declares bias=true, but RMSNorm is scale-only: a bias changes the function and no "
         "RMSNorm checkpoint has one", 2, 3)]


SHARED = """block A(x: [B, S, D]) -> [B, S, D] {{
  n: layernorm(D{tied})
  attn: self_attention(heads=H)
  mlp: mlp(F)
  h = x + attn(n(x))
  y = h + mlp(n(h))
  return y
}}
"""


def test_e0307_one_norm_at_two_sites() -> None:
    assert findings(SHARED.format(tied="")) == [
        ("E0307", "layernorm 'n' is applied to 'x' and to 'h': one instance at two sites ties their learned scale",
         6, 15)]


def test_tied_norm_and_recomputation_are_fine() -> None:
    assert findings(SHARED.format(tied=", tied=true")) == []
    # the Harvard expanded form normalizes the same value three times: a recomputation, not a shared instance
    assert findings("""block A(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  attn: extern(q: [B, S, D], k: [B, S, D], v: [B, S, D]) -> [B, S, D]
  y = x + attn(n(x), n(x), n(x))
  return y
}
""") == []


def test_w0301_half_precision_statistics() -> None:
    assert findings(layer("rmsnorm(D, accum=f16)", "[B, S, D] f16")) == [
        ("W0301", "rmsnorm 'n' accumulates the row statistics of 'x' (f16) in f16", 4, 13)]
    assert findings(layer("rmsnorm(D, accum=f32)", "[B, S, D] bf16")) == []


def test_w0302_one_eps_per_family() -> None:
    assert findings("""block A(x: [B, S, D]) -> [B, S, D] {
  n1: rmsnorm(D, eps=1e-6)
  n2: rmsnorm(D, eps=1e-6)
  n3: rmsnorm(D, eps=1e-5)
  f: extern(x: [B, S, D]) -> [B, S, D]
  y = n3(x + f(n1(x)) + f(n2(x)))
  return y
}
""")[0] == ("W0302", "eps of rmsnorm 'n3' is 1e-05, but rmsnorm 'n1' uses 1e-06", 4, 3)


def test_examples_keep_the_contract() -> None:
    from conftest import EXAMPLES
    for path in EXAMPLES:
        program = blockir.parse(path.read_text(), str(path))
        assert [d for d in blockir.verify(program) if d.code[1:3] == "03"] == [], path
