"""Arguments that contradict each other or the sizes, and literals beyond every numeric range."""
from __future__ import annotations

import pytest
import torch

import blockir
from blockir.diagnostics import BlockError
from blockir.ir.printer import format_program

HEAD = "dim B: batch\ndim S: seq\ndim D: model = 64\n"


def layer(*decls: str, use: str = "h = x + attn(norm(x))") -> str:
    body = "\n".join(f"  {d}" for d in decls)
    return HEAD + f"block Layer(x: [B, S, D]) -> [B, S, D] {{\n{body}\n  {use}\n  return h\n}}\n"


def codes(text: str) -> list[str]:
    try:
        program = blockir.parse(text, "t.block")
    except BlockError as exc:
        return [d.code for d in exc.diagnostics]
    return [d.code for d in blockir.verify(program) if d.is_error]


def messages(text: str) -> list[str]:
    try:
        blockir.parse(text, "t.block")
    except BlockError as exc:
        return [d.message for d in exc.diagnostics]
    return []


@pytest.mark.parametrize("digits", [25, 310, 5000])
def test_an_integer_literal_of_any_length_is_too_large_not_a_crash(digits: int) -> None:
    [message] = messages(HEAD.replace("= 64", "= " + "9" * digits))
    assert message.endswith("is too large (the limit is 2**62)")
    if digits > 300:
        assert message == f"constant of {digits} digits is too large (the limit is 2**62)"


@pytest.mark.parametrize("expr, message", [
    ("1e309", "number is too large for a float"),
    ("10 ** 400", "constant is too large"),
    ("1e300 * 1e300", "constant is not a finite number"),
    ("2.0 ** 1024", "constant is too large"),
    ("0.5 ** -2000", "exponent is too large"),
    ("4611686018427387904 * 4", "constant 1.84e+19 is too large (the limit is 2**62)"),
])
def test_constant_arithmetic_is_bounded(expr: str, message: str) -> None:
    assert messages(f"const c = {expr}\n") == [message]


@pytest.mark.parametrize("decl, message", [
    ("layernorm(D, affine=false, bias=true)",
     "'bias' contradicts affine=false: the bias is affine state: affine=false learns no bias"),
    ("rmsnorm(D, affine=false, offset=1)",
     "'offset' contradicts affine=false: offset=1 scales by (1 + weight); affine=false has no weight"),
    ("rmsnorm(D, bias=true, affine=false)",
     "'bias' contradicts affine=false: the bias is affine state: affine=false learns no bias"),
])
def test_contradictory_norm_arguments_are_rejected(decl: str, message: str) -> None:
    assert messages(layer(f"norm: {decl}", "attn: self_attention(heads=2)")) == [message]


def test_rope_theta_without_rope_is_rejected_with_a_hint() -> None:
    text = layer("norm: layernorm(D)", "attn: self_attention(heads=2, rope_theta=500000)")
    with pytest.raises(BlockError) as info:
        blockir.parse(text, "t.block")
    [d] = info.value.diagnostics
    assert (d.code, d.hint) == ("E0119", "remove 'rope_theta' or set rope=true")


def test_an_argument_ruled_out_by_default_follows_and_prints_so() -> None:
    program = blockir.parse(layer("norm: layernorm(D, affine=false)", "attn: self_attention(heads=2)"), "t.block")
    text = format_program(program)
    assert "norm: layernorm(D, eps=1e-05, bias=false, affine=false," in text
    assert blockir.parse(text, "t.block") == program
    module = blockir.compile(program, "Layer")
    assert not [k for k in module.state_dict() if k.startswith("norm.")]


@pytest.mark.parametrize("decl, code", [
    ("self_attention(heads=256)", "E0209"),
    ("self_attention(heads=3)", "E0209"),
    ("self_attention(heads=4, kv_heads=3)", "E0210"),
    ("self_attention(heads=64, rope=true)", "E0211"),
    ("self_attention(heads=2, head_dim=5, rope=true)", "E0211"),
    ("self_attention(heads=0.5)", "E0212"),
    ("self_attention(heads=4, kv_heads=0)", "E0212"),
])
def test_attention_sizes_are_checked_against_the_width(decl: str, code: str) -> None:
    assert codes(layer("norm: layernorm(D)", f"attn: {decl}")) == [code]


@pytest.mark.parametrize("decl", ["self_attention(heads=3, head_dim=8)", "self_attention(heads=8, kv_heads=2)",
                                  "self_attention(heads=4, rope=true)"])
def test_consistent_attention_sizes_are_clean(decl: str) -> None:
    assert codes(layer("norm: layernorm(D)", f"attn: {decl}")) == []


def test_heads_against_a_width_given_only_at_compile_time() -> None:
    text = layer("norm: layernorm(D)", "attn: self_attention(heads=3)").replace("= 64", "")
    program = blockir.parse(text, "t.block")
    assert codes(text) == []
    assert blockir.compile(program, "Layer", dims={"D": 48})(torch.randn(1, 2, 48)).shape == (1, 2, 48)
    with pytest.raises(BlockError) as info:
        blockir.compile(program, "Layer", dims={"D": 64})
    assert [(d.code, d.message) for d in info.value.diagnostics] == [
        ("E0209", "heads=3 of 'attn' does not divide its width D = 64")]


def test_an_argument_ruled_out_as_unset_keeps_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule whose implied value is "unset" leaves the argument out; it must not drop the declaration (and
    with it, silently, the whole block)."""
    import dataclasses

    from blockir.ir.kinds import KINDS, Implies
    spec = KINDS["self_attention"]
    rule = Implies("alibi", True, "softcap", None, "ALiBi biases the raw scores")
    monkeypatch.setitem(KINDS, "self_attention", dataclasses.replace(spec, implies=spec.implies + (rule,)))
    program = blockir.parse(layer("norm: layernorm(D)", "attn: self_attention(heads=2, alibi=true)"), "t.block")
    [decl] = [d for d in program.block("Layer").decls if d.name == "attn"]
    assert decl.arg("alibi") is True and decl.arg("softcap") is None
    assert messages(layer("norm: layernorm(D)", "attn: self_attention(heads=2, alibi=true, softcap=30.0)")) == [
        "'softcap' contradicts alibi=true: ALiBi biases the raw scores"]
