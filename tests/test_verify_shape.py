"""shape-ownership: exact diagnostics for every code, and silence on correct blocks."""
from __future__ import annotations

import blockir

HEAD = """dim B: batch
dim S: seq
dim T: seq
dim D: model = 64
dim E: hidden = 32
dim F: hidden = 256
dim H: heads = 4
dim K: head_dim = 16
"""


def findings(body: str) -> list[tuple[str, str, int, int]]:
    text = HEAD + body
    return [(d.code, d.message, d.span.line - HEAD.count("\n"), d.span.column)
            for d in blockir.verify(blockir.parse(text, "t.block"))]


def test_e0201_other_axes() -> None:
    assert findings("""block A(x: [B, S, D]) -> [B, S, D] {
  f: extern(x: [B, S, D]) -> [B, S, E, D]
  y = x + f(x)
  return y
}
""") == [("E0201", "operands of '+' have different axes: 'x' is [B, S, D], 'f(…)' is [B, S, E, D]", 3, 7)]


def test_e0202_row_owners_differ_even_with_equal_sizes() -> None:
    assert findings("""block A(x: [B, T, D], m: [B, S, D]) -> [B, T, D] {
  proj: extern(m: [B, S, D]) -> [B, S, D]
  y = x + proj(m)
  return y
}
""") == [("E0202", "'+' joins different row owners: 'x' has rows [B, T], 'proj(…)' has rows [B, S]", 3, 7)]


def test_e0203_mlp_intermediate() -> None:
    assert findings("""block A(x: [B, S, D]) -> [B, S, D] {
  up: linear(D, F)
  y = x + up(x)
  return y
}
""") == [("E0203", "'up(…)' has width F, the stream has width D ([B, S, F] vs [B, S, D])", 3, 7)]


def test_e0204_unmerged_heads() -> None:
    assert findings("""block A(x: [B, S, D]) -> [B, S, D] {
  attn: extern(x: [B, S, D]) -> [B, H, S, K]
  y = x + attn(x)
  return y
}
""") == [("E0204", "'attn(…)' still has its heads split ([B, H, S, K]); the stream is [B, S, D]", 3, 7)]


def test_e0205_concat_on_the_stream_and_no_cascade() -> None:
    assert findings("""block A(x: [B, S, D]) -> [B, S, D] {
  f: extern(x: [B, S, D]) -> [B, S, D]
  y = concat(x, f(x))
  return y
}
""") == [("E0205", "concatenating the residual state 'x' widens it to [B, S, D+D]", 3, 7)]


def test_concat_inside_a_branch_is_fine() -> None:
    assert findings("""block A(x: [B, S, D]) -> [B, S, D] {
  a: extern(x: [B, S, D]) -> [B, S, E]
  b: extern(x: [B, S, D]) -> [B, S, E]
  down: linear(E, D)
  y = x + down(concat(a(x), b(x)))
  return y
}
""") == [("E0207", "linear 'down' maps E to D, but 'concat(…)' is [B, S, E+E]", 5, 11)]


def test_e0206_memory_added_to_the_decoder_state() -> None:
    assert findings("""block A(x: [B, T, D], memory: [B, S, D]) -> [B, T, D] {
  y = x + dropout(memory, p=0.1)
  return y
}
""") == [("E0206", "encoder memory 'memory' [B, S, D] is added to the decoder state 'x' [B, T, D]", 2, 7)]


def test_e0206_cross_attention_queried_from_memory() -> None:
    assert findings("""block A(x: [B, T, D], memory: [B, S, D]) -> [B, T, D] {
  n: layernorm(D)
  src: cross_attention(heads=H)
  y = x + src(memory, n(x))
  return y
}
""") == [("E0206", "cross-attention 'src' takes its queries from 'memory', so its output has rows [B, S], not the "
          "decoder rows [B, T]", 4, 7)]


def test_e0207_extern_and_block_arguments() -> None:
    assert findings("""block Inner(x: [B, S, D]) -> [B, S, D] {
  f: extern(x: [B, S, D]) -> [B, S, D]
  y = x + f(x)
  return y
}

block A(x: [B, T, D]) -> [B, T, D] {
  g: extern(x: [B, S, D]) -> [B, T, D]
  inner: Inner
  y = x + g(x)
  z = inner(y)
  return y
}
""") == [("E0207", "'g' takes x: [B, S, D], got 'x' [B, T, D]", 10, 11),
         ("E0207", "'inner' takes x: [B, S, D], got 'y' [B, T, D]", 11, 7),
         ("W0120", "value 'z' is never used", 11, 7)]


def test_e0207_branch_on_a_hidden_axis() -> None:
    assert findings("""block A(x: [B, S, D]) -> [B, S, D] {
  up: linear(D, F)
  mlp: mlp(F)
  down: linear(F, D)
  y = x + down(mlp(up(x)))
  return y
}
""") == [("E0207", "mlp 'mlp' reads model-width rows, got 'up(…)' [B, S, F]", 5, 16)]


def test_e0208_returned_axes() -> None:
    assert findings("""block A(x: [B, S, D]) -> [B, S, D] {
  up: linear(D, F)
  return up(x)
}
""") == [("E0208", "block 'A' returns 'up(…)' [B, S, F] but declares [B, S, D]", 3, 3)]


def test_cross_attention_output_joins_the_decoder_rows() -> None:
    assert findings("""block A(x: [B, T, D], memory: [B, S, D]) -> [B, T, D] {
  n: layernorm(D)
  src: cross_attention(heads=H)
  y = x + src(n(x), memory)
  return y
}
""") == []


def test_diagnostics_carry_a_note_at_the_odd_operand() -> None:
    text = HEAD + "block A(x: [B, S, D]) -> [B, S, D] {\n  up: linear(D, F)\n  y = x + up(x)\n  return y\n}\n"
    (d,) = blockir.verify(blockir.parse(text, "t.block"))
    assert d.hint == "contract F back to D (the MLP's down projection) before the add"
    assert [(n.message, n.span.line, n.span.column) for n in d.notes] == [("'up(…)' is [B, S, F]", 11, 11)]
