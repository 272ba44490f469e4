"""Fixup (arXiv:1901.09321) and DeepScaleLM (arXiv:2403.09635): graph, initialisation and fold, in float64."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import blockir
from blockir.ir.printer import format_program
from blockir.lower.fold import fold_deepscalelm
from blockir.passes.recipes import RecipeError, deepscalelm, fixup
from conftest import ROOT
from oracle import assert_matches_reference

SOURCE = """
dim B: batch
dim S: seq
dim D: model = 16
dim F: hidden = 32
dim H: heads = 4

block Layer(x: [B, S, D]) -> [B, S, D] {{
  ln_1: layernorm(D, accum=f64)
  {first}
  ln_2: layernorm(D, accum=f64)
  mlp: mlp(F, act=relu)

  h = x + {call}(ln_1(x))
  y = h + mlp(ln_2(h))
  return y
}}

model Decoder(x: [B, S, D]) -> [B, S, D] {{
  layers: Layer * 12
  norm: layernorm(D, accum=f64)
  return norm(layers(x))
}}
"""
ATTENTION = SOURCE.format(first="self_attn: self_attention(heads=H, causal=true)", call="self_attn")
# two MLP branches: the oracle below needs no attention
MLPS = SOURCE.format(first="ffn: mlp(F, act=relu)", call="ffn")


def _program(text: str) -> blockir.Program:
    return blockir.parse(text, "source.block")


def _ln(x: Tensor) -> Tensor:
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + 1e-5)


def _mlp(x: Tensor, p: dict[str, Tensor], name: str) -> Tensor:
    return F.linear(F.relu(F.linear(x, p[f"{name}.fc1.weight"], p[f"{name}.fc1.bias"])),
                    p[f"{name}.fc2.weight"], p[f"{name}.fc2.bias"])


def _fixup_mlp(x: Tensor, p: dict[str, Tensor], name: str) -> Tensor:
    """Fixup's branch (Fig. 1 of the paper) inside the MLP: a scalar bias before the activation and one before fc2."""
    h = F.relu(F.linear(x, p[f"{name}.fc1.weight"], p[f"{name}.fc1.bias"]) + p[f"{name}.fixup_bias_act"])
    return F.linear(h + p[f"{name}.fixup_bias_out"], p[f"{name}.fc2.weight"], p[f"{name}.fc2.bias"])


def _check(m: torch.nn.Module, reference: Callable[[Tensor, dict[str, Tensor]], Tensor]) -> None:
    """Forward and the gradient of the input and of every parameter against ``reference(x, params)``."""
    assert_matches_reference(m, reference, (2, 3, 16))


# ------------------------------------------------------------------------------------------ Fixup

@pytest.mark.parametrize("backend", ["fx", "fused"])
def test_fixup_update_is_its_equation(backend: str) -> None:
    """x_{l+1} = x_l + s_l fc2(act(fc1(x_l + a_l) + c_l) + d_l) + b_l, with no norm: a scalar bias before each
    weight layer and the activation, a scalar multiplier at the end."""
    result = fixup.apply(_program(MLPS), "Layer")
    m = blockir.compile(result.program, "Layer", backend=backend, seed=0, dtype=torch.float64)
    assert not [n for n, _ in m.named_parameters() if "ln_" in n]
    assert {n for n, _ in m.named_parameters() if "fixup_bias_" in n} == \
        {f"{b}.fixup_bias_{w}" for b in ("ffn", "mlp") for w in ("act", "out")}

    def ref(x: Tensor, p: dict[str, Tensor]) -> Tensor:
        h = x + p["fixup_scale1"] * _fixup_mlp(x + p["fixup_bias1a"], p, "ffn") + p["fixup_bias1b"]
        return h + p["fixup_scale2"] * _fixup_mlp(h + p["fixup_bias2a"], p, "mlp") + p["fixup_bias2b"]
    _check(m, ref)


def test_fixup_biases_of_a_gated_mlp_and_an_attention() -> None:
    """The gated MLP's scalar biases sit before its activation and its down projection; attention's before o_proj
    (the value mixing between V and O is linear, so there is no activation to precede)."""
    text = SOURCE.format(first="ffn: gated_mlp(F, act=silu, bias=true, fixup_bias=true)", call="ffn") \
        .replace("mlp: mlp(F, act=relu)", "mlp: self_attention(heads=H, causal=true, fixup_bias=true)")
    m = blockir.compile(_program(text), "Layer", seed=0, dtype=torch.float64)
    plain = blockir.compile(_program(text.replace(", fixup_bias=true", "")), "Layer", seed=0, dtype=torch.float64)
    assert set(m.state_dict()) - set(plain.state_dict()) == \
        {"ffn.fixup_bias_act", "ffn.fixup_bias_out", "mlp.fixup_bias_out"}
    assert all(m.state_dict()[k].item() == 0.0 for k in ("ffn.fixup_bias_act", "ffn.fixup_bias_out"))

    def gated(x: Tensor, p: dict[str, Tensor]) -> Tensor:
        g = F.linear(x, p["ffn.gate_proj.weight"], p["ffn.gate_proj.bias"]) + p["ffn.fixup_bias_act"]
        u = F.linear(x, p["ffn.up_proj.weight"], p["ffn.up_proj.bias"])
        return F.linear(F.silu(g) * u + p["ffn.fixup_bias_out"], p["ffn.down_proj.weight"], p["ffn.down_proj.bias"])

    def ref(x: Tensor, p: dict[str, Tensor]) -> Tensor:
        def ln(v: Tensor, n: str) -> Tensor:
            return _ln(v) * p[f"{n}.weight"] + p[f"{n}.bias"]
        h = x + gated(ln(x, "ln_1"), p)
        v = ln(h, "ln_2")
        heads = [t.unflatten(-1, (4, 4)).transpose(1, 2) for t in
                 (F.linear(v, p[f"mlp.{r}_proj.weight"]) for r in ("q", "k", "v"))]
        mixed = F.scaled_dot_product_attention(*heads, is_causal=True).transpose(1, 2).flatten(-2)
        return h + F.linear(mixed + p["mlp.fixup_bias_out"], p["mlp.o_proj.weight"])
    _check(m, ref)


def _without_init(program: blockir.Program) -> blockir.Program:
    """``program`` with every branch's per-role init arguments dropped: the default initialisation."""
    text = format_program(program)
    for arg in (", init_scale=fixup_rescale", ", init_zero=true", ", init_std=fan_in"):
        text = text.replace(arg, "")
    return blockir.parse(text, "base.block")


@pytest.mark.parametrize("backend", ["fx", "fused"])
def test_fixup_init_is_applied_by_compile(backend: str) -> None:
    """o_proj and fc2 start at zero, v_proj and fc1 at L^(-1/2) times their default, q/k untouched."""
    result = fixup.apply(_program(ATTENTION), "Layer")
    assert result.init is None
    base = blockir.compile(_without_init(result.program), "Decoder", seed=0, dtype=torch.float64)
    m = blockir.compile(result.program, "Decoder", backend=backend, seed=0, dtype=torch.float64)
    before, after = base.state_dict(), m.state_dict()
    assert before.keys() == after.keys()
    for i in range(12):
        layer = f"layers.{i}"
        for key in ("self_attn.o_proj.weight", "mlp.fc2.weight", "mlp.fc2.bias"):
            assert torch.count_nonzero(after[f"{layer}.{key}"]) == 0, key
            assert torch.count_nonzero(before[f"{layer}.{key}"]) > 0, key
        for key in ("self_attn.v_proj.weight", "mlp.fc1.weight"):  # modules are built in float32, then cast
            assert torch.equal(after[f"{layer}.{key}"], (before[f"{layer}.{key}"].float() * 24 ** -0.5).double()), key
        for key in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "mlp.fc1.bias"):
            assert torch.equal(after[f"{layer}.{key}"], before[f"{layer}.{key}"]), key
        assert after[f"{layer}.fixup_scale1"].item() == 1.0 and after[f"{layer}.fixup_bias2b"].item() == 0.0
        for key in ("self_attn.fixup_bias_out", "mlp.fixup_bias_act", "mlp.fixup_bias_out"):
            assert after[f"{layer}.{key}"].item() == 0.0, key
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    assert torch.equal(m(x), x)  # every branch starts at zero: the stack is the identity


def test_fixup_rescale_follows_the_stack_depth_or_a_given_one() -> None:
    program = fixup.apply(_program(ATTENTION.replace("Layer * 12", "Layer * 8")), "Layer").program
    m = blockir.compile(program, "Decoder", seed=0, dtype=torch.float64)
    base = blockir.compile(_without_init(program), "Decoder", seed=0, dtype=torch.float64)
    assert torch.equal(m.state_dict()["layers.7.mlp.fc1.weight"],
                       (base.state_dict()["layers.7.mlp.fc1.weight"].float() * 16 ** -0.5).double())
    fixed = fixup.apply(_program(ATTENTION), "Layer", depth=3).program
    assert "const fixup_rescale = (2 * 3) ** (-0.5)" in format_program(fixed)


def test_fixup_example_initialises_itself() -> None:
    m = blockir.compile(blockir.load(ROOT / "examples" / "fixup.block"), "FixupDecoder", seed=0)
    sd = m.state_dict()
    assert all(torch.count_nonzero(sd[f"layers.{i}.{k}"]) == 0 for i in range(12)
               for k in ("self_attn.o_proj.weight", "mlp.fc2.weight", "mlp.fc2.bias"))


def test_fixup_refuses_a_fused_qkv() -> None:
    text = ATTENTION.replace("causal=true)", "causal=true, fused=stacked)")
    with pytest.raises(RecipeError, match="fused=none"):
        fixup.apply(_program(text), "Layer")


def test_init_scale_contradicts_a_fused_qkv() -> None:
    text = ATTENTION.replace("causal=true)", "causal=true, fused=heads, init_scale=0.5)")
    with pytest.raises(blockir.BlockError) as exc:
        _program(text)
    assert [(d.code, d.span.line, d.span.column) for d in exc.value.diagnostics] == [("E0119", 10, 75)]


def test_gated_mlp_roles_of_each_init_argument() -> None:
    """init_std draws gate/up at 2/fan_in and down at 1/fan_in; init_scale then scales gate and up; init_zero zeroes
    down."""
    text = SOURCE.format(first="ffn: gated_mlp(F, init_std=fan_in, init_scale=0.5, init_zero=true)", call="ffn")
    base = blockir.compile(_program(SOURCE.format(first="ffn: gated_mlp(F, init_std=fan_in)", call="ffn")), "Layer",
                           seed=0, dtype=torch.float64).state_dict()
    sd = blockir.compile(_program(text), "Layer", seed=0, dtype=torch.float64).state_dict()
    for key in ("ffn.gate_proj.weight", "ffn.up_proj.weight"):
        assert torch.equal(sd[key], (base[key].float() * 0.5).double()), key
    assert torch.count_nonzero(sd["ffn.down_proj.weight"]) == 0 and torch.count_nonzero(base["ffn.down_proj.weight"])
    wide = SOURCE.replace("model = 16", "model = 512").replace("hidden = 32", "hidden = 1024")
    sd = blockir.compile(_program(wide.format(first="ffn: gated_mlp(F, init_std=fan_in)", call="ffn")), "Layer",
                         seed=0, dtype=torch.float64).state_dict()
    for key, var in (("ffn.gate_proj.weight", 2 / 512), ("ffn.up_proj.weight", 2 / 512),
                     ("ffn.down_proj.weight", 1 / 1024)):
        assert sd[key].var().item() == pytest.approx(var, rel=0.02), key


def test_fixup_example_is_the_recipe_output() -> None:
    example = blockir.load(ROOT / "examples" / "fixup.block")
    text = ATTENTION.replace("Layer", "FixupLayer").replace("Decoder", "FixupDecoder") \
        .replace("dim D: model = 16", "dim D: model = 64").replace("dim F: hidden = 32", "dim F: hidden = 4 * D")
    result = fixup.apply(_program(text), "FixupLayer")
    assert result.program.block("FixupLayer").decls == example.block("FixupLayer").decls
    assert blockir.verify(result.program) == []


def test_deepscalelm_example_is_the_recipe_output() -> None:
    example = blockir.load(ROOT / "examples" / "deepscalelm.block")
    text = ATTENTION.replace("Layer", "DeepScaleLMLayer").replace("Decoder", "DeepScaleLMDecoder") \
        .replace("dim D: model = 16", "dim D: model = 64").replace("dim F: hidden = 32", "dim F: hidden = 4 * D") \
        .replace(", accum=f64", "")
    result = deepscalelm.apply(_program(text), "DeepScaleLMLayer")
    assert result.program.block("DeepScaleLMLayer").decls == example.block("DeepScaleLMLayer").decls


# ------------------------------------------------------------------------------------------ DeepScaleLM

def test_deepscalelm_constants_keep_unit_variance() -> None:
    lam, beta = deepscalelm.constants(12)
    assert beta ** 2 == pytest.approx(2 / 12, rel=1e-15) and lam ** 2 + beta ** 2 == pytest.approx(1, rel=1e-15)


@pytest.mark.parametrize("backend", ["fx", "fused"])
def test_deepscalelm_update_is_its_equation(backend: str) -> None:
    """x_{l+1} = lambda x_l + beta F_l(LN(x_l)) on a Pre-LN block."""
    result = deepscalelm.apply(_program(MLPS), "Layer")
    lam, beta = deepscalelm.constants(12)
    m = blockir.compile(result.program, "Layer", backend=backend, seed=0, dtype=torch.float64)

    def ref(x: Tensor, p: dict[str, Tensor]) -> Tensor:
        def ln(v: Tensor, n: str) -> Tensor:
            return _ln(v) * p[f"{n}.weight"] + p[f"{n}.bias"]
        h = lam * x + beta * _mlp(ln(x, "ln_1"), p, "ffn")
        return lam * h + beta * _mlp(ln(h, "ln_2"), p, "mlp")
    _check(m, ref)


def test_deepscalelm_init_statistics_are_applied_by_compile() -> None:
    text = ATTENTION.replace("dim D: model = 16", "dim D: model = 256").replace("dim F: hidden = 32",
                                                                                "dim F: hidden = 512")
    result = deepscalelm.apply(_program(text), "Layer")
    assert result.init is None
    m = blockir.compile(result.program, "Layer", seed=0, dtype=torch.float64)
    sd = m.state_dict()
    for key, fan_in, gain in (("self_attn.q_proj.weight", 256, 1), ("self_attn.v_proj.weight", 256, 1),
                              ("self_attn.o_proj.weight", 256, 1), ("mlp.fc1.weight", 256, 2),
                              ("mlp.fc2.weight", 512, 1)):
        w = sd[key]
        assert abs(w.mean().item()) < 3 * (gain / fan_in / w.numel()) ** 0.5, key
        assert w.var().item() == pytest.approx(gain / fan_in, rel=0.02), key
    assert torch.count_nonzero(sd["mlp.fc1.bias"]) == 0 and torch.count_nonzero(sd["mlp.fc2.bias"]) == 0


def test_deepscalelm_example_initialises_itself() -> None:
    sd = blockir.compile(blockir.load(ROOT / "examples" / "deepscalelm.block"), "DeepScaleLMDecoder", seed=0,
                         dtype=torch.float64).state_dict()
    for key, var in (("self_attn.v_proj.weight", 1 / 64), ("mlp.fc1.weight", 2 / 64), ("mlp.fc2.weight", 1 / 256)):
        w = torch.stack([sd[f"layers.{i}.{key}"] for i in range(12)])
        assert w.var().item() == pytest.approx(var, rel=0.02), key
    assert all(torch.count_nonzero(sd[f"layers.{i}.mlp.fc1.bias"]) == 0 for i in range(12))


def test_deepscalelm_fold_moves_beta_into_the_last_linears() -> None:
    result = deepscalelm.apply(_program(ATTENTION), "Layer")
    m = blockir.compile(result.program, "Decoder", seed=0, dtype=torch.float64)
    program, state = fold_deepscalelm(result.program, "Layer", m)
    assert "branch_scale *" not in "".join(op.text() for op in program.block("Layer").ops)
    folded = blockir.compile(program, "Decoder", seed=1, dtype=torch.float64)
    folded.load_state_dict(state, strict=True)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(folded(x), m(x), rtol=1e-12, atol=1e-12)
    beta = deepscalelm.constants(12)[1]
    torch.testing.assert_close(state["layers.3.mlp.fc2.weight"], m.state_dict()["layers.3.mlp.fc2.weight"] * beta)


POST_LN = """
dim B: batch
dim S: seq
dim D: model = 16
dim F: hidden = 32

block Layer(x: [B, S, D]) -> [B, S, D] {
  attn: self_attention(heads=4, causal=true)
  ln_1: layernorm(D, accum=f64)
  mlp: gated_mlp(F, bias=true)
  ln_2: rmsnorm(D, offset=1, accum=f64)
  h = ln_1(x + attn(x))
  y = ln_2(h + mlp(h))
  return y
}

model Decoder(x: [B, S, D]) -> [B, S, D] {
  layers: Layer * 6
  return layers(x)
}
"""


def test_deepscalelm_fold_moves_lambda_into_the_norm_gains_of_a_post_ln_stack() -> None:
    """N_i(lambda x + beta F(x)), x = N_{i-1}(...), computed on the stream lambda x: every norm but the stack's
    last times lambda (LayerNorm's gain and shift; RMSNorm's 1 + w), the stream-reading linears over lambda,
    beta in the last linears and the stack input times lambda. Folded == unfolded in float64, to 1e-12, with
    every parameter off its init; the hand-computed update checks the recipe's graph first."""
    result = deepscalelm.apply(_program(POST_LN), "Layer")
    lam, beta = deepscalelm.constants(6)
    m = blockir.compile(result.program, "Decoder", seed=0, dtype=torch.float64)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    x = torch.randn(2, 5, 16, generator=gen, dtype=torch.float64)
    layer0 = m.get_submodule("layers.0")
    sd = m.state_dict()
    h = F.layer_norm(lam * x + beta * layer0.attn(x), (16,), sd["layers.0.ln_1.weight"], sd["layers.0.ln_1.bias"])
    s = lam * h + beta * layer0.mlp(h)
    want = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + sd["layers.0.ln_2.weight"])
    torch.testing.assert_close(layer0(x), want, rtol=1e-12, atol=1e-12)

    program, state = fold_deepscalelm(result.program, "Layer", m)
    text = format_program(program)
    assert "skip_scale *" not in "".join(op.text() for op in program.block("Layer").ops)
    assert "branch_scale" not in text and "const deepscalelm" not in text
    assert "skip_scale * x" in "".join(op.text() for op in program.block("Decoder").ops)
    assert blockir.verify(program) == []
    folded = blockir.compile(program, "Decoder", seed=1, dtype=torch.float64)
    folded.load_state_dict(state, strict=True)
    torch.testing.assert_close(folded(x), m(x), rtol=1e-12, atol=1e-12)
    for key, factor in (("layers.0.ln_1.weight", lam), ("layers.0.ln_1.bias", lam),
                        ("layers.2.attn.q_proj.weight", 1 / lam), ("layers.2.mlp.up_proj.weight", 1 / lam),
                        ("layers.2.mlp.up_proj.bias", 1.0), ("layers.2.mlp.down_proj.bias", beta),
                        ("layers.5.ln_2.weight", 1.0)):
        torch.testing.assert_close(state[key], sd[key] * factor, rtol=1e-15, atol=0, msg=key)
    torch.testing.assert_close(1 + state["layers.4.ln_2.weight"], (1 + sd["layers.4.ln_2.weight"]) * lam)


def test_deepscalelm_fold_of_two_stacks_keeps_each_stack_output() -> None:
    """Each stack's input takes lambda and its last norm keeps its state, so the second stack reads the first's
    output unscaled and scales it itself."""
    text = POST_LN.replace("  return layers(x)", "  more: Layer * 6\n  return more(layers(x))")
    result = deepscalelm.apply(_program(text), "Layer")
    m = blockir.compile(result.program, "Decoder", seed=0, dtype=torch.float64)
    program, state = fold_deepscalelm(result.program, "Layer", m)
    folded = blockir.compile(program, "Decoder", seed=1, dtype=torch.float64)
    folded.load_state_dict(state, strict=True)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(folded(x), m(x), rtol=1e-12, atol=1e-12)
    assert torch.equal(state["layers.5.ln_2.weight"], m.state_dict()["layers.5.ln_2.weight"])


def test_blockir_fold_points_a_post_ln_skip_scale_to_the_two_sided_fold() -> None:
    from blockir.analyses.fold_legality import fold_report
    for source, two_sided in ((POST_LN, True), (ATTENTION, False)):
        program = deepscalelm.apply(_program(source), "Layer").program
        skips = [site for site in fold_report(program.block("Layer"), "infer") if site.name.startswith("skip_scale")]
        assert len(skips) == 2 and all(not site.legal and site.code == "shortcut" for site in skips)
        assert all(("folds two-sided instead" in site.reason) == two_sided for site in skips), source


def test_deepscalelm_keeps_lambda_on_a_pre_ln_stack() -> None:
    program = deepscalelm.apply(_program(ATTENTION), "Layer").program
    assert deepscalelm.skip_fold(program, "Layer").reason == (
        "a Pre-LN update scales the stream itself, which no gain reads: only each norm's epsilon could absorb "
        "lambda (eps lambda^(-2l) at layer l), and the layers share one block")


def test_deepscalelm_scales_that_do_not_keep_unit_variance_are_an_error() -> None:
    text = (ROOT / "examples" / "deepscalelm.block").read_text().replace("(1 - 2 / 12) ** 0.5", "0.95")
    diags = blockir.verify(blockir.parse(text, "d.block"))
    assert [(d.code, d.span.line) for d in diags] == [("E0441", 25), ("E0441", 26)]
    assert diags[0].message == ("DeepScaleLM scales lambda = 0.95 and beta = 0.408248 give lambda^2 + beta^2 = "
                                "1.06917, not 1: the update does not keep unit variance")


def test_deepscalelm_needs_three_layers() -> None:
    with pytest.raises(RecipeError, match="N >= 3"):
        deepscalelm.apply(_program(ATTENTION), "Layer", depth=2)
