"""RealFormer: scores carried layer to layer, checked against the paper's equations in float64.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv:2012.11747), Post-LN:
    S_l = Q_l K_l^T / sqrt(d_k) + S_{l-1},  S_0 = 0
    Attn_l = softmax(S_l + M) V_l W_O        (M: the causal mask)
    h = LN(x + Attn_l),  y = LN(h + W_2 gelu(W_1 h + b_1) + b_2)
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import blockir
from blockir.lifecycle.telemetry import score_stats
from conftest import ROOT

EXAMPLE = ROOT / "examples" / "realformer.block"
# float64 throughout: statistics and the softmax in the input dtype, not the example's f32 policy
FLOAT64_TEXT = EXAMPLE.read_text().replace("layernorm(D)", "layernorm(D, accum=f64)").replace(
    "score_residual=sum", "softmax_f32=false, score_residual=sum")
FLOAT64 = blockir.parse(FLOAT64_TEXT, str(EXAMPLE))
DIMS = {"D": 16, "F": 32}
HEADS, LAYERS = 4, 4


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5) * w + b


def _oracle(x: torch.Tensor, p: dict[str, torch.Tensor], mean: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The stack's output and last score state; ``mean``: R_l = ((l - 1) R_{l-1} + A_l) / l instead of the sum."""
    b, s, d = x.shape
    hd = d // HEADS
    prev = torch.zeros(b, HEADS, s, s, dtype=x.dtype)
    later = torch.ones(s, s, dtype=torch.bool).triu(1)

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(b, s, HEADS, hd).transpose(1, 2)

    for i in range(LAYERS):
        w = {k.split(".", 2)[2]: v for k, v in p.items() if k.startswith(f"layers.{i}.")}
        q, k, v = (heads(x @ w[f"attn.{n}_proj.weight"].T) for n in "qkv")
        raw = q @ k.transpose(-1, -2) / math.sqrt(hd)
        prev = (i * prev + raw) / (i + 1) if mean else raw + prev
        probs = torch.softmax(prev.masked_fill(later, float("-inf")), dim=-1)
        a = (probs @ v).transpose(1, 2).reshape(b, s, d) @ w["attn.o_proj.weight"].T
        h = _layer_norm(x + a, w["ln_1.weight"], w["ln_1.bias"])
        f = F.gelu(h @ w["mlp.fc1.weight"].T + w["mlp.fc1.bias"]) @ w["mlp.fc2.weight"].T + w["mlp.fc2.bias"]
        x = _layer_norm(h + f, w["ln_2.weight"], w["ln_2.bias"])
    return x, prev


@pytest.mark.parametrize("policy", ["sum", "mean"])
@pytest.mark.parametrize("backend", ["fx", "fused"])
def test_realformer_stack_matches_the_paper_forward_and_gradients_float64(backend: str, policy: str) -> None:
    program = FLOAT64 if policy == "sum" else blockir.parse(
        FLOAT64_TEXT.replace("score_residual=sum", "score_residual=mean"), str(EXAMPLE))
    m = blockir.compile(program, "RealFormer", backend=backend, dims=DIMS, dtype=torch.float64, seed=0)
    torch.manual_seed(0)
    x = torch.randn(2, 6, 16, dtype=torch.float64, requires_grad=True)
    names = [n for n, _ in m.named_parameters()]
    params = [t for _, t in m.named_parameters()]
    y, values = blockir.trace(m, x)
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in zip(names, params)}
    x_ref = x.detach().clone().requires_grad_(True)
    y_ref, s_ref = _oracle(x_ref, leaves, mean=policy == "mean")
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(values["layers.3.s_next"], s_ref, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, *params], g)
    want = torch.autograd.grad(y_ref, [x_ref, *leaves.values()], g)
    for name, a, b in zip(["x", *names], got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=name)
    if backend == "fx":  # the fused backend inlines the stack into one graph
        assert isinstance(m.layers, torch.nn.ModuleList) and len(m.layers) == LAYERS


def test_score_state_is_the_running_sum_of_every_layers_raw_scores() -> None:
    m = blockir.compile(FLOAT64, "RealFormer", dims=DIMS, dtype=torch.float64, seed=1)
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    _, values = blockir.trace(m, x)
    for i in range(1, LAYERS):
        step = values[f"layers.{i}.s_next"] - values[f"layers.{i - 1}.s_next"]
        layer = m.layers[i]
        q = (values[f"layers.{i}.x"] @ layer.attn.q_proj.weight.T).view(1, 5, HEADS, 4).transpose(1, 2)
        k = (values[f"layers.{i}.x"] @ layer.attn.k_proj.weight.T).view(1, 5, HEADS, 4).transpose(1, 2)
        torch.testing.assert_close(step, q @ k.transpose(-1, -2) / 2.0, rtol=1e-10, atol=1e-10)


def test_running_mean_state_is_the_mean_of_every_layers_raw_scores() -> None:
    text = FLOAT64_TEXT.replace("score_residual=sum", "score_residual=mean")
    m = blockir.compile(blockir.parse(text, str(EXAMPLE)), "RealFormer", dims=DIMS, dtype=torch.float64, seed=1)
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    _, values = blockir.trace(m, x)
    raws = []
    for i in range(LAYERS):
        layer = m.layers[i]
        q = (values[f"layers.{i}.x"] @ layer.attn.q_proj.weight.T).view(1, 5, HEADS, 4).transpose(1, 2)
        k = (values[f"layers.{i}.x"] @ layer.attn.k_proj.weight.T).view(1, 5, HEADS, 4).transpose(1, 2)
        raws.append(q @ k.transpose(-1, -2) / 2.0)
        torch.testing.assert_close(values[f"layers.{i}.s_next"], sum(raws) / (i + 1), rtol=1e-10, atol=1e-10)
    assert "score_count=4" in repr(m.layers[3].attn.core)


def test_score_telemetry_measures_rms_and_entropy_of_the_allowed_keys() -> None:
    zeros = torch.zeros(1, 1, 3, 3, dtype=torch.float64)
    assert score_stats(zeros, causal=False) == pytest.approx((0.0, math.log(3)))
    # causal rows see 1, 2, 3 keys: uniform attention over them
    assert score_stats(zeros, causal=True) == pytest.approx((0.0, (math.log(1) + math.log(2) + math.log(3)) / 3))
    assert score_stats(torch.full((1, 1, 2, 2), 2.0, dtype=torch.float64), causal=False)[0] == pytest.approx(2.0)


def test_the_realformer_page_declares_a_program_that_verifies_clean() -> None:
    text = (ROOT / "docs" / "realformer.md").read_text()
    snippet = text.split("```block\n", 1)[1].split("```", 1)[0]
    program = blockir.parse(snippet, "realformer.md")
    assert [d for d in blockir.verify(program) if d.is_error] == []
    assert program.block("RealFormerLayer").results == blockir.parse(EXAMPLE.read_text()).block(
        "RealFormerLayer").results


def test_manifest_names_the_carried_score_state() -> None:
    from blockir.analyses.manifest import program_manifest
    blocks = program_manifest(blockir.parse(EXAMPLE.read_text()))["blocks"]
    assert blocks["RealFormerLayer"]["carried_streams"] == [{"input": "s", "axes": ["B", "H", "S", "S"],
                                                             "kind": "scores"}]
    assert blocks["RealFormerLayer"]["topology"] == "post_ln"
    assert "carried_streams" not in blocks["RealFormer"]


def test_cost_ledger_counts_the_carried_scores_of_each_layer() -> None:
    from blockir.ir.types import DType
    from blockir.reports.cost import format_ledger, ledger
    led = ledger(blockir.parse(EXAMPLE.read_text()), "RealFormer", {"B": 2, "S": 16}, DType.BF16)
    layer, whole = led.blocks
    assert (layer.name, layer.instances, layer.carried_bytes, whole.carried_bytes) == ("RealFormerLayer", 4,
                                                                                        2 * 4 * 16 * 16 * 2, 0)
    assert "bytes of carried streams" in format_ledger(led)


def test_fused_backend_keeps_a_stack_it_cannot_inline_and_threads_its_scores() -> None:
    """Branch dropout keeps the fused backend from inlining the stack: each layer is its own fused graph."""
    text = FLOAT64_TEXT.replace("h = ln_1(x + a)", "h = ln_1(x + dropout(a, p=0.1))")
    program = blockir.parse(text, "dropout.block")
    fx = blockir.compile(program, "RealFormer", dims=DIMS, dtype=torch.float64, seed=0).eval()
    fused = blockir.compile(program, "RealFormer", backend="fused", dims=DIMS, dtype=torch.float64, seed=0).eval()
    fused.load_state_dict(fx.state_dict())
    assert isinstance(fused.layers, torch.nn.ModuleList) and fused.layers.carried == 2
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(fused(x), fx(x), rtol=1e-12, atol=1e-12)


def test_blockir_run_prints_score_norm_and_entropy_per_layer(tmp_path) -> None:
    import io
    import json
    from contextlib import redirect_stderr, redirect_stdout

    from blockir.cli import main
    data = tmp_path / "text.txt"
    data.write_text("residual attention carries scores from layer to layer. " * 40)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["run", str(EXAMPLE), "--steps", "2", "--dims", "B=2,S=8", "--data", str(data),
                     "--format", "json"])
    assert code == 0, err.getvalue()
    scores = json.loads(out.getvalue())["scores"]
    assert [s["site"] for s in scores] == [f"layers.{i}.s_next" for i in range(LAYERS)]
    # causal rows 1..8 see 1..8 keys: the mean entropy lies between 0 and the mean of log(keys)
    bound = sum(math.log(k) for k in range(1, 9)) / 8
    assert all(s["rms"] > 0 and 0 < s["entropy"] <= bound + 1e-9 for s in scores)
