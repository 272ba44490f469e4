"""Depth and normalization recipes: constants against the papers' tables, graphs, initialisation, training."""
from __future__ import annotations

import io
import math
from contextlib import redirect_stderr, redirect_stdout
from typing import Iterator

import pytest
import torch

import blockir
from blockir.analyses.sizes import block_env, program_env
from blockir.lifecycle import admin, session
from blockir.analyses.sizes import Sizes
from blockir.analyses.sites import residual_sites
from blockir.cli import main
from blockir.ops import NormOp, ScaleOp
from blockir.ir.printer import format_program
from blockir.ir.program import Program
from blockir.passes.recipes import RECIPES, RecipeError, RecipeResult, deepnorm, layerscale, rezero, tfixup
from conftest import ROOT

DIMS = {"B": 2, "S": 8}


def source(layers: int, width: int = 32, accum: str = "f32") -> str:
    """A Pre-LN and a Post-LN layer with built-in branches, each stacked ``layers`` deep."""
    return f"""
dim B: batch
dim S: seq
dim D: model = {width}
dim F: hidden = 2 * D
dim H: heads = 2

block PreLNLayer(x: [B, S, D]) -> [B, S, D] {{
  ln_1: layernorm(D, eps=1e-5, accum={accum})
  attn: self_attention(heads=H, causal=true)
  ln_2: layernorm(D, eps=1e-5, accum={accum})
  mlp: mlp(F, act=gelu)
  h = x + dropout(attn(ln_1(x)), p=0.1)
  y = h + dropout(mlp(ln_2(h)), p=0.1)
  return y
}}

model PreLNModel(x: [B, S, D]) -> [B, S, D] {{
  layers: PreLNLayer * {layers}
  norm: layernorm(D, eps=1e-5, accum={accum})
  return norm(layers(x))
}}

block PostLNLayer(x: [B, S, D]) -> [B, S, D] {{
  attn: self_attention(heads=H, causal=true)
  ln_1: layernorm(D, eps=1e-5, accum={accum})
  mlp: mlp(F, act=gelu)
  ln_2: layernorm(D, eps=1e-5, accum={accum})
  h = ln_1(x + dropout(attn(x), p=0.1))
  y = ln_2(h + dropout(mlp(h), p=0.1))
  return y
}}

model PostLNModel(x: [B, S, D]) -> [B, S, D] {{
  layers: PostLNLayer * {layers}
  return layers(x)
}}
"""


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    # the tensors here are a few kilobytes: intra-op threads cost more than they save on a small CI machine
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def program(layers: int = 4, **kw: object) -> Program:
    return blockir.parse(source(layers, **kw), "recipes.block")  # type: ignore[arg-type]


def example(name: str) -> Program:
    return blockir.load(ROOT / "examples" / f"{name}.block")


def const(p: Program, block: str, name: str, num_layers: int) -> float:
    return float(block_env(program_env(p), p.block(block), 0, num_layers)[name])


def xavier_std(fan_in: int, fan_out: int) -> float:
    return math.sqrt(2.0 / (fan_in + fan_out))


def std(t: torch.Tensor) -> float:
    return t.detach().double().std().item()


def stacked(module: torch.nn.Module, path: str, layers: int) -> torch.Tensor:
    """One parameter of every layer of a stack, flattened together (more samples for a std)."""
    return torch.cat([module.get_parameter(f"layers.{i}.{path}").detach().flatten() for i in range(layers)])


# --- DeepNorm ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,m", [(6, 6), (12, 12), (18, 18), (64, 64), (100, 100), (12, 6), (6, 18)])
def test_deepnorm_constants_are_the_deepnet_table(n: int, m: int) -> None:
    assert deepnorm.constants("encoder-only", n, m) == pytest.approx(((2 * n) ** 0.25, (8 * n) ** -0.25))
    assert deepnorm.constants("decoder-only", n, m) == pytest.approx(((2 * m) ** 0.25, (8 * m) ** -0.25))
    assert deepnorm.constants("encoder-decoder", n, m, "encoder") == pytest.approx(
        (0.81 * (n ** 4 * m) ** (1 / 16), 0.87 * (n ** 4 * m) ** (-1 / 16)))
    assert deepnorm.constants("encoder-decoder", n, m, "decoder") == pytest.approx(
        ((3 * m) ** 0.25, (12 * m) ** -0.25))


def test_deepnorm_decoder_only_64_layers_by_hand() -> None:
    alpha, beta = deepnorm.constants("decoder-only", 64, 64)
    assert (round(alpha, 4), round(beta, 4)) == (3.3636, 0.2102)  # 128^(1/4), 512^(-1/4)


def test_deepnorm_constants_in_the_ir_follow_the_stack_depth() -> None:
    new = deepnorm.apply(program(64), "PostLNLayer", arch="decoder-only").program
    assert const(new, "PostLNLayer", "alpha", 64) == pytest.approx(128 ** 0.25)
    assert const(new, "PostLNLayer", "beta", 64) == pytest.approx(512 ** -0.25)
    text = (ROOT / "examples" / "encoder_decoder.block").read_text().replace("EncoderLayer * 6", "EncoderLayer * 12")
    encdec = blockir.parse(text, "encdec.block")
    enc = deepnorm.apply(encdec, "EncoderLayer", arch="encoder-decoder").program
    dec = deepnorm.apply(encdec, "DecoderLayer", arch="encoder-decoder").program
    assert const(enc, "EncoderLayer", "alpha", 12) == pytest.approx(0.81 * (12 ** 4 * 6) ** (1 / 16))
    assert const(enc, "EncoderLayer", "beta", 12) == pytest.approx(0.87 * (12 ** 4 * 6) ** (-1 / 16))
    assert const(dec, "DecoderLayer", "alpha", 6) == pytest.approx(18 ** 0.25)
    assert const(dec, "DecoderLayer", "beta", 6) == pytest.approx(72 ** -0.25)


def test_deepnorm_puts_alpha_on_the_shortcut_of_a_post_ln_sum() -> None:
    result = deepnorm.apply(program(), "PreLNLayer", arch="decoder-only")
    block = result.program.block("PreLNLayer")
    # h = ln_1(alpha * x + dropout(attn(x))), y = ln_2(alpha * h + dropout(mlp(h)))
    module = blockir.compile(result.program, "PreLNLayer", dims=DIMS, seed=0).eval()
    x = torch.randn(2, 8, 32)
    _, values = blockir.trace(module, x)
    alpha = 2 ** 0.25  # compiled alone: num_layers = 1
    sites = residual_sites(result.program, block, Sizes.of(result.program, DIMS))
    assert [site for site, _, _ in sites] == [op.operand for op in block.ops if isinstance(op, NormOp)]
    for (total, shortcut, (update,)), state, norm in zip(sites, ("x", "h"), (module.ln_1, module.ln_2)):
        torch.testing.assert_close(values[shortcut], alpha * values[state])
        torch.testing.assert_close(values[total], values[shortcut] + values[update])
    torch.testing.assert_close(values["h"], module.ln_1(values[sites[0][0]]))
    assert "norm" not in result.program.block_map["PreLNModel"].decl_map  # a Post-LN stack ends normalized


def test_deepnorm_scales_v_o_and_mlp_by_beta_but_not_q_k() -> None:
    layers, width = 8, 256
    result = deepnorm.apply(program(layers, width=width), "PostLNLayer", arch="decoder-only")
    module = blockir.compile(result.program, "PostLNModel", dims=DIMS, seed=0)
    beta = (8 * layers) ** -0.25
    square, wide = xavier_std(width, width), xavier_std(width, 2 * width)
    for path, expected in (("attn.v_proj.weight", square * beta), ("attn.o_proj.weight", square * beta),
                           ("mlp.fc1.weight", wide * beta), ("mlp.fc2.weight", wide * beta),
                           ("attn.q_proj.weight", square), ("attn.k_proj.weight", square)):
        assert std(stacked(module, path, layers)) == pytest.approx(expected, rel=0.02), path


def test_deepnorm_refuses_what_it_cannot_initialise() -> None:
    with pytest.raises(RecipeError, match="'attention.self' \\(extern\\) is not a built-in"):
        deepnorm.apply(example("bert"), "BertLayer", arch="encoder-only")
    with pytest.raises(RecipeError, match="use arch='encoder-decoder'"):
        deepnorm.apply(example("encoder_decoder"), "DecoderLayer", arch="decoder-only")
    with pytest.raises(RecipeError, match="one branch per add"):
        deepnorm.apply(example("parallel"), "ParallelBlock", arch="decoder-only")
    with pytest.raises(RecipeError, match="already defines 'alpha'"):
        deepnorm.apply(example("deepnorm"), "DeepNormLayer", arch="decoder-only")
    with pytest.raises(RecipeError, match="unknown architecture"):
        deepnorm.apply(example("llama"), "LlamaDecoderLayer", arch="decoder")


# --- ReZero -----------------------------------------------------------------------------------------------

def test_rezero_starts_as_the_identity_and_its_gates_get_the_gradient() -> None:
    result = rezero.apply(program(), "PreLNLayer")
    new = result.program
    assert not any(isinstance(op, NormOp) for b in new.blocks if b.name.startswith("PreLN") for op in b.ops)
    module = blockir.compile(new, "PreLNModel", dims=DIMS, seed=0).eval()
    assert sorted(n for n, _ in module.named_parameters() if "resweight" in n)[:2] == ["layers.0.resweight_1",
                                                                                    "layers.0.resweight_2"]
    x = torch.randn(2, 8, 32)
    target = torch.randn(2, 8, 32)
    y, values = blockir.trace(module, x)
    assert torch.equal(y, x)  # every gate is 0: the stack is exactly the identity
    (y * target).sum().backward()
    gate = module.get_parameter("layers.0.resweight_1")
    # dL/dg = <dL/dx_{l+1}, F(x_l)> and the branch's own weights get nothing while g = 0
    (gated,) = residual_sites(new, new.block("PreLNModel"), Sizes.of(new, DIMS))[0].updates  # layers.0.(g * F)
    scale = new.block("PreLNLayer").producers[gated.removeprefix("layers.0.")]
    assert isinstance(scale, ScaleOp) and scale.param == "resweight_1"
    branch = values[f"layers.0.{scale.operand}"]
    assert gate.grad.item() == pytest.approx((target * branch).sum().item(), rel=1e-5)
    assert torch.count_nonzero(module.get_parameter("layers.0.attn.v_proj.weight").grad) == 0


def test_rezero_can_keep_the_norms() -> None:
    new = rezero.apply(program(), "PreLNLayer", remove_norms=False).program
    assert {"ln_1", "ln_2"} <= set(new.block("PreLNLayer").decl_map)
    assert "norm" in new.block("PreLNModel").decl_map
    module = blockir.compile(new, "PreLNModel", dims=DIMS, seed=0).eval()
    x = torch.randn(2, 8, 32)
    torch.testing.assert_close(module(x), module.norm(x))  # the layers are the identity, the final norm is not


# --- LayerScale -------------------------------------------------------------------------------------------

def test_layerscale_eps_follows_cait() -> None:
    assert [layerscale.cait_eps(d) for d in (12, 18, 19, 24, 25, 36)] == [0.1, 0.1, 1e-5, 1e-5, 1e-6, 1e-6]


def test_layerscale_scales_each_branch_output_by_its_gain() -> None:
    result = layerscale.apply(program(24), "PreLNLayer")
    assert result.report.constants == (("eps (CaiT rule for depth 24)", 1e-5),)
    module = blockir.compile(result.program, "PreLNModel", dims=DIMS, seed=0).eval()
    gains = [p for n, p in module.named_parameters() if n.endswith("gamma")]
    assert len(gains) == 48 and all(torch.all(g == 1e-5) for g in gains)
    layer = module.get_submodule("layers.0")
    x = torch.randn(2, 8, 32)
    _, values = blockir.trace(layer, x)
    new = result.program
    (_, _, (first,)), _ = residual_sites(new, new.block("PreLNLayer"), Sizes.of(new, DIMS))
    torch.testing.assert_close(values[first], 1e-5 * layer.attn(layer.ln_1(x)))  # dropout is off in eval
    assert layerscale.apply(program(4), "PreLNLayer", eps=0.5).report.constants[0][1] == 0.5


def test_layerscale_needs_a_pre_ln_block() -> None:
    with pytest.raises(RecipeError, match="not Pre-LN"):
        layerscale.apply(program(), "PostLNLayer")
    with pytest.raises(RecipeError, match="already scaled by a learned gain"):
        layerscale.apply(example("layerscale"), "LayerScaleBlock")


# --- T-Fixup ----------------------------------------------------------------------------------------------

def test_tfixup_gains_are_the_papers() -> None:
    for n in (6, 12, 64):
        g = tfixup.gains(n)
        assert g["decoder"] == pytest.approx((9 * n) ** -0.25)
        assert g["encoder"] == pytest.approx(0.67 * n ** -0.25)


def test_tfixup_removes_every_norm_and_scales_v_o_and_mlp() -> None:
    p = example("encoder_decoder")
    p = tfixup.apply(p, "EncoderLayer").program
    p = tfixup.apply(p, "DecoderLayer").program
    assert not any(isinstance(op, NormOp) for b in p.blocks for op in b.ops)
    module = blockir.compile(p, "Decoder", dims={"B": 2, "S": 8, "T": 4}, seed=0)
    gain, square = (9 * 6) ** -0.25, xavier_std(64, 64)
    for path in ("self_attn.v_proj.weight", "self_attn.o_proj.weight", "src_attn.v_proj.weight",
                 "src_attn.o_proj.weight"):
        assert std(stacked(module, path, 6)) == pytest.approx(square * gain, rel=0.05), path
    for path in ("self_attn.q_proj.weight", "src_attn.k_proj.weight"):
        assert std(stacked(module, path, 6)) == pytest.approx(square, rel=0.05), path
    assert std(stacked(module, "feed_forward.fc2.weight", 6)) == pytest.approx(xavier_std(256, 64) * gain, rel=0.05)
    encoder = blockir.compile(p, "Encoder", dims={"B": 2, "S": 8}, seed=0)
    assert std(stacked(encoder, "self_attn.v_proj.weight", 6)) == pytest.approx(square * 0.67 * 6 ** -0.25, rel=0.05)


def test_tfixup_states_its_contract_and_a_copied_exponent_breaks_it() -> None:
    p = example("encoder_decoder")
    p = tfixup.apply(tfixup.apply(p, "EncoderLayer").program, "DecoderLayer").program
    assert blockir.verify(p) == []
    text = format_program(p)
    assert text.count("const tfixup = 1") == 2
    # the decoder given the encoder's scale: the copied exponent of the wrong side
    wrong = text.replace("const gain = (9 * num_layers) ** (-0.25)", "const gain = 0.67 * num_layers ** (-0.25)")
    diags = blockir.verify(blockir.parse(wrong, "wrong.block"))
    assert {d.code for d in diags} == {"E0445"} and len(diags) == 3  # self-attention, cross-attention, MLP
    assert diags[0].message == ("init_gain of 'self_attn' is 0.428092 in a 6-layer stack, but T-Fixup's scale is "
                                "0.368894 (decoder)")


def test_run_refuses_warmup_for_a_tfixup_program(tmp_path) -> None:
    p = tfixup.apply(program(4), "PreLNLayer").program
    path = tmp_path / "tfixup.block"
    path.write_text(format_program(p))
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = main(["run", str(path), "--steps", "1", "--warmup", "5"])
    assert code == 1
    assert "error[E0756]: 'PreLNLayer' states tfixup = 1, and T-Fixup trains without learning-rate warmup, but " \
           "the run asks for --warmup 5" in err.getvalue()


# --- Admin ------------------------------------------------------------------------------------------------

def test_admin_omega_is_the_profiled_cumulative_variance() -> None:
    base = program(4)
    result = admin.apply(base, "PostLNLayer", dims=DIMS, seed=3)
    new = result.program
    module = blockir.compile(new, "PostLNModel", dims=DIMS, seed=0)
    result.init(module)
    # independently: the same module with every omega at 1, one eval pass over the same batch
    reference = blockir.compile(new, "PostLNModel", dims=DIMS, seed=0).eval()
    x = session.random_inputs(new, new.block("PostLNModel"), DIMS, torch.Generator().manual_seed(3))[0]
    _, values = blockir.trace(reference, x)
    sites = residual_sites(new, new.block("PostLNModel"), Sizes.of(new, DIMS))
    total = x.double().var(unbiased=False).item()
    for i, (site, _, (update,)) in enumerate(sites):
        layer, sub = divmod(i, 2)
        omega = module.get_parameter(f"layers.{layer}.omega_{sub + 1}")
        assert torch.allclose(omega, torch.full_like(omega, math.sqrt(total))), site
        total += values[update].double().var(unbiased=False).item()
    assert result.init.profile is not None and result.init.profile.tokens == 16
    assert module.training  # the profile ran in eval mode and gave the mode back


def test_admin_fold_keeps_the_function_and_resets_omega() -> None:
    new = admin.apply(program(3, accum="f64"), "PostLNLayer", dims=DIMS).program
    result = admin.apply(program(3, accum="f64"), "PostLNLayer", dims=DIMS)
    module = blockir.compile(new, "PostLNModel", dims=DIMS, seed=0, dtype=torch.float64).eval()
    result.init(module)
    with torch.no_grad():  # stand in for training: move every parameter away from its init
        for p in module.parameters():
            p.add_(0.2 * torch.randn_like(p))
    x = torch.randn(2, 8, 32, dtype=torch.float64)
    before = module(x)
    folded = result.init.fold(module)
    assert folded == [f"layers.{i}.omega_{j}" for i in range(3) for j in (1, 2)][1:]
    assert all(torch.all(module.get_parameter(p) == 1) for p in folded)
    assert not torch.all(module.get_parameter("layers.0.omega_1") == 1)  # the stack input's omega stays
    torch.testing.assert_close(module(x), before, rtol=1e-10, atol=1e-10)
    with torch.no_grad():  # half a fold (the norm without the branch) changes the function
        module.get_parameter("layers.1.ln_1.weight").mul_(2.0)
    assert not torch.allclose(module(x), before, atol=1e-3)


def test_the_admin_graph_is_a_pass_and_its_profile_a_run() -> None:
    """The recipe writes the graph alone; the lifecycle's apply adds the init that measures the variances."""
    p = program(2)
    graph = RECIPES["admin"](p, "PostLNLayer")
    profiled = admin.apply(p, "PostLNLayer", dims=DIMS)
    assert graph.init is None and profiled.init is not None
    assert (graph.program, graph.report) == (profiled.program, profiled.report)


def test_admin_warns_only_about_its_shortcut_vectors() -> None:
    result = admin.apply(example("llama"), "LlamaDecoderLayer", dims=DIMS)
    diags = blockir.verify(result.program)
    assert [d.code for d in diags] == ["W0402", "W0402"]
    assert "omega_1" in diags[0].message and "omega_2" in diags[1].message
    with pytest.raises(ValueError, match="compiled from 'LlamaModel'"):
        result.init(blockir.compile(result.program, "LlamaDecoderLayer", dims=DIMS))


# --- every recipe -----------------------------------------------------------------------------------------

def every_recipe(p: Program) -> dict[str, RecipeResult]:
    return {"deepnorm": deepnorm.apply(p, "PostLNLayer", arch="decoder-only"),
            "deepnorm-from-pre-ln": deepnorm.apply(p, "PreLNLayer", arch="decoder-only"),
            "rezero": rezero.apply(p, "PreLNLayer"),
            "layerscale": layerscale.apply(p, "PreLNLayer"),
            "tfixup": tfixup.apply(p, "PreLNLayer"),
            "admin": admin.apply(p, "PostLNLayer", dims=DIMS)}


ALL = {"ReZero", "LayerScale", "DeepNorm", "T-Fixup", "Admin"}


@pytest.mark.parametrize("name,block,arch,applies", [
    ("llama", "LlamaDecoderLayer", "decoder-only", ALL),
    ("encoder_decoder", "EncoderLayer", "encoder-decoder", ALL),
    ("encoder_decoder", "DecoderLayer", "encoder-decoder", ALL),
    ("torch_encoder", "TransformerEncoderLayerNormFirst", "encoder-only", {"ReZero", "LayerScale", "Admin"}),
    ("gpt_neox", "GPTNeoXLayer", "decoder-only", {"ReZero", "LayerScale"}),
    ("parallel", "ParallelBlock", "decoder-only", {"ReZero", "LayerScale", "T-Fixup"})])
def test_recipes_print_parse_back_and_verify(name: str, block: str, arch: str, applies: set[str]) -> None:
    p = example(name)
    results = []
    for apply, options in ((rezero.apply, {}), (rezero.apply, {"remove_norms": False}), (layerscale.apply, {}),
                           (deepnorm.apply, {"arch": arch}), (tfixup.apply, {}), (admin.apply, {})):
        try:
            results.append(apply(p, block, **options))
        except RecipeError:
            continue  # outside the recipe's contract (externs, parallel sums); refusals are tested above
    assert {r.report.recipe for r in results} == applies
    for r in results:
        assert blockir.parse(format_program(r.program), r.program.filename) == r.program
        warnings = [d.code for d in blockir.verify(r.program)]
        assert set(warnings) <= ({"W0402"} if r.report.recipe == "Admin" else set()), (r.report.recipe, warnings)


@pytest.mark.parametrize("name", ["deepnorm", "rezero", "layerscale", "tfixup", "admin"])
def test_a_64_layer_stack_trains(name: str) -> None:
    result = every_recipe(program(64))[name]
    model = "PostLNModel" if name in ("deepnorm", "admin") else "PreLNModel"
    report = session.run_session(result.program, result.program.block(model),
                                 session.RunConfig(steps=2, seed=0, lr=1e-3, dims=DIMS, init=result.init))
    assert len(report.losses) == 2 and all(math.isfinite(v) for v in report.losses), report.losses
    assert len(report.sites) == 128
    rho = [r for s in report.sites for r in s.rho]
    assert all(math.isfinite(v) for s in report.sites for v in (*s.rho, *s.cos))
    assert 0 < max(rho) < 10, f"{name}: update ratio p50/p90/p99 range {min(rho):.3g}..{max(rho):.3g}"


def test_recipe_results_are_plain_programs() -> None:
    for name, r in every_recipe(program(2)).items():
        assert isinstance(r.program, Program) and r.report.block in r.program.block_map, name
        assert (r.init is None) == (name != "admin")
        assert str(r.report).startswith(r.report.recipe)


def test_fused_programs_are_refused() -> None:
    from blockir.passes.fuse import fuse_program
    fused, _ = fuse_program(program())
    with pytest.raises(RecipeError, match="already fused"):
        rezero.apply(fused, "PostLNLayer")


# --- the command --------------------------------------------------------------------------------------------

def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_recipe_command_prints_a_program_that_verifies() -> None:
    llama = str(ROOT / "examples" / "llama.block")
    code, out, err = run_cli("recipe", "deepnorm", llama, "--block", "LlamaDecoderLayer", "--arch", "decoder-only")
    assert code == 0 and err.startswith("DeepNorm on LlamaDecoderLayer") and "alpha (num_layers=2) = 1.41421" in err
    new = blockir.parse(out, "deepnorm.block")
    assert blockir.verify(new) == []
    shortcut = [op for op in new.block("LlamaDecoderLayer").ops if isinstance(op, ScaleOp)]
    assert [op.operand for op in shortcut] == ["x", "h"]
    code, _, err = run_cli("recipe", "deepnorm", llama, "--block", "LlamaDecoderLayer")
    assert code == 2 and "needs --arch" in err
    code, _, err = run_cli("recipe", "layerscale", str(ROOT / "examples" / "bert.block"), "--block", "BertLayer")
    assert code == 2 and "not Pre-LN" in err
