"""PRepBN, RepBN and BatchNorm against float64 oracles written from the equations of
"SLAB: Efficient Transformers with Simplified Linear Attention and Progressive Re-parameterized
Batch Normalization" (arXiv:2405.11582); calibration, the fixed-statistics fold, telemetry."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch

import blockir
from blockir.analyses.fold_legality import fold_report
from blockir.lower.layers.norm_module import Norm
from blockir.cli import main
from blockir.ops import NormOp
from blockir.lower.fold import apply_folds
from conftest import ROOT

DIMS = {"B": 3, "S": 5, "D": 8}
BLOCK = """dim B: batch
dim S: seq
dim D: model = 8
dim F: hidden = 16
dim H: heads = 2

block P(x: [B, S, D]) -> [B, S, D] {{
  norm1: prepbn(D, steps={steps}, padding=mask, momentum=0.25, eps=1e-3, ln_eps=1e-4, eta=0.5, accum=f64)
  attn: self_attention(heads=H, causal=true, bias=true, out_bias=true)
  norm2: prepbn(D, steps={steps}, padding=mask, momentum=0.25, eps=1e-3, ln_eps=1e-4, eta=0.5, accum=f64)
  mlp: mlp(F, act=gelu)
  h = x + attn(norm1(x))
  y = h + mlp(norm2(h))
  return y
}}
"""


def _compile(steps: int = 4, backend: str = "fx") -> tuple[blockir.Program, torch.nn.Module]:
    program = blockir.parse(BLOCK.format(steps=steps))
    torch.manual_seed(0)
    m = blockir.compile(program, "P", backend=backend, dims=DIMS).double()
    with torch.no_grad():  # away from the init values, so every term of the equation shows
        for name, p in m.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return program, m


# --- the oracle: plain torch from the paper's equations ---------------------------------------

def oracle_norm(x: torch.Tensor, n: Norm, keep: torch.Tensor | None, t: int, training: bool,
                running: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """gamma(t) LN(x) + (1 - gamma(t)) (BN(x) + eta x), gamma(t) = clip((T - t) / T, 0, 1)."""
    mu_r = x.mean(-1, keepdim=True)
    ln = (x - mu_r) / torch.sqrt(((x - mu_r) ** 2).mean(-1, keepdim=True) + n.ln.eps) * n.ln.weight + n.ln.bias
    if training:
        rows = x.reshape(-1, x.shape[-1])
        rows = rows[keep.reshape(-1)] if keep is not None else rows
        mu, var = rows.mean(0), ((rows - rows.mean(0)) ** 2).mean(0)
    else:
        mu, var = running
    bn = n.bn.weight * (x - mu) / torch.sqrt(var + n.bn.eps) + n.bn.bias
    gamma = min(max((n.transition - t) / n.transition, 0.0), 1.0)
    return gamma * ln + (1 - gamma) * (bn + n.bn.eta * x)


def oracle_block(m: torch.nn.Module, x: torch.Tensor, keep: torch.Tensor | None, t: int, training: bool,
                 running: dict | None = None) -> torch.Tensor:
    ctx = {"attention_mask": keep.long()} if keep is not None else {}
    h = x + m.attn(oracle_norm(x, m.norm1, keep, t, training, running and running["norm1"]), **ctx)
    return h + m.mlp(oracle_norm(h, m.norm2, keep, t, training, running and running["norm2"]))


def _grads(out: torch.Tensor, inputs: list[torch.Tensor], seed: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(out, inputs, seed))


@pytest.mark.parametrize("t", [0, 2, 4, 7])  # LayerNorm only, mid-transition, the end, past the end
def test_forward_and_every_gradient_match_the_oracle_in_training(t: int) -> None:
    _, m = _compile()
    for n in (m.norm1, m.norm2):
        n.step.fill_(t)
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    keep = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    params = [x, *m.parameters()]
    ref = oracle_block(m, x, keep, t, training=True)
    y = m(x, attention_mask=keep.long())
    seed = torch.randn_like(y)
    assert torch.allclose(y, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(_grads(y, params, seed), _grads(ref, params, seed)):
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)
    assert int(m.norm1.step) == t + 1 and int(m.norm1.bn.num_batches_tracked) == 1


def test_running_moments_follow_the_equation_and_skip_padded_rows() -> None:
    _, m = _compile()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    keep = torch.ones(3, 5, dtype=torch.bool)
    keep[1, 2:] = False
    m(x, attention_mask=keep.long())
    rows = x.reshape(-1, 8)[keep.reshape(-1)]
    # running = (1 - momentum) running + momentum batch, with the unbiased batch variance
    assert torch.allclose(m.norm1.bn.running_mean, 0.25 * rows.mean(0), rtol=1e-13, atol=0)
    assert torch.allclose(m.norm1.bn.running_var, 0.75 + 0.25 * rows.var(0, unbiased=True), rtol=1e-13, atol=0)
    # padded rows' contents reach neither the moments nor the real tokens' outputs
    _, m2 = _compile()
    noisy = x.clone()
    noisy[1, 2:] = 1e3 * torch.randn(3, 8, dtype=torch.float64)
    y1 = m2(x, attention_mask=keep.long())
    _, m3 = _compile()
    y3 = m3(noisy, attention_mask=keep.long())
    assert torch.allclose(y1[keep], y3[keep], rtol=1e-12, atol=1e-12)
    assert torch.equal(m2.norm1.bn.running_mean, m3.norm1.bn.running_mean)


@pytest.mark.parametrize("t", [1, 4])
def test_eval_uses_the_running_moments_and_keeps_the_step(t: int) -> None:
    _, m = _compile()
    for n in (m.norm1, m.norm2):
        n.step.fill_(t)
        n.bn.running_mean.copy_(torch.randn(8, dtype=torch.float64))
        n.bn.running_var.copy_(torch.rand(8, dtype=torch.float64) + 0.5)
    m.eval()
    running = {k: (getattr(m, k).bn.running_mean.clone(), getattr(m, k).bn.running_var.clone())
               for k in ("norm1", "norm2")}
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    params = [x, *m.parameters()]
    y, ref = m(x), oracle_block(m, x, None, t, training=False, running=running)
    seed = torch.randn_like(y)
    assert torch.allclose(y, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(_grads(y, params, seed), _grads(ref, params, seed)):
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)
    # one example's output does not depend on the others in evaluation
    assert torch.allclose(m(x[:1]), y[:1], rtol=1e-12, atol=1e-12)
    assert int(m.norm1.step) == t and int(m.norm1.bn.num_batches_tracked) == 0


def test_fused_backend_computes_the_same_function() -> None:
    _, fx = _compile(backend="fx")
    _, fused = _compile(backend="fused")
    fused.load_state_dict(fx.state_dict())
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    assert torch.allclose(fx(x), fused(x), rtol=1e-12, atol=1e-12)


def test_calibration_averages_the_batch_moments_with_everything_else_frozen() -> None:
    _, m = _compile()
    for _ in range(3):
        m(torch.randn(3, 5, 8, dtype=torch.float64))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    batches = [torch.randn(3, 5, 8, dtype=torch.float64) for _ in range(4)]
    states = blockir.calibrate(m, batches)
    rows = [b.reshape(-1, 8) for b in batches]
    assert torch.allclose(m.norm1.bn.running_mean, torch.stack([r.mean(0) for r in rows]).mean(0), rtol=1e-12)
    assert torch.allclose(m.norm1.bn.running_var, torch.stack([r.var(0) for r in rows]).mean(0), rtol=1e-12)
    assert [(s.name, s.step, s.tracked, s.calibrated_at, s.age) for s in states] == [
        ("norm1", 3, 4, 4, 0), ("norm2", 3, 4, 4, 0)]
    changed = {k for k in before if not torch.equal(before[k], m.state_dict()[k])}
    assert changed == {f"{n}.bn.{b}" for n in ("norm1", "norm2")
                       for b in ("running_mean", "running_var", "num_batches_tracked", "calibrated_at")}
    assert m.training  # the caller's mode comes back


def test_fold_is_exact_after_the_transition_and_calibration() -> None:
    program, m = _compile(steps=2)
    for _ in range(2):
        m(torch.randn(3, 5, 8, dtype=torch.float64))
    blockir.calibrate(m, [torch.randn(3, 5, 8, dtype=torch.float64) for _ in range(2)])
    m.eval()
    result = apply_folds(program, "P", m, dims=DIMS)
    assert [(e.site.name, e.rule) for e in result.report] == [
        ("norm1", "statistics-into-linears"), ("norm2", "statistics-into-linears")]
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    want = m(x)
    err = ((result.module(x) - want).norm() / want.norm()).item()
    assert err <= 1e-10, err
    folded = result.program.block("P")
    assert not any(isinstance(op, NormOp) for op in folded.ops)
    assert not any(k.startswith("norm") for k in result.module.state_dict())


def test_fold_is_refused_mid_transition_and_on_stale_statistics() -> None:
    program, m = _compile(steps=4)
    m(torch.randn(3, 5, 8, dtype=torch.float64))
    m.eval()
    with pytest.raises(blockir.BlockError) as early:
        apply_folds(program, "P", m, dims=DIMS)
    assert [d.code for d in early.value.diagnostics] == ["E0751"]
    assert "at step 1 of its 4-step transition (gamma = 0.75)" in early.value.diagnostics[0].message
    for n in (m.norm1, m.norm2):
        n.step.fill_(4)
    with pytest.raises(blockir.BlockError) as never:
        apply_folds(program, "P", m, dims=DIMS)
    assert "never calibrated" in never.value.diagnostics[0].message
    blockir.calibrate(m, [torch.randn(3, 5, 8, dtype=torch.float64)])
    m.train()
    m(torch.randn(3, 5, 8, dtype=torch.float64))
    m.eval()
    with pytest.raises(blockir.BlockError) as stale:
        apply_folds(program, "P", m, dims=DIMS)
    assert [d.code for d in stale.value.diagnostics] == ["E0752"]
    assert "trained 1 batches past their calibration" in stale.value.diagnostics[0].message


def test_fold_report_names_the_statistics_sites() -> None:
    block = blockir.parse(BLOCK.format(steps=4).replace("norm2: prepbn(D, steps=4,", "norm2: batchnorm(D, rep=true, "
                                                        "running=false,").replace(", ln_eps=1e-4, eta=0.5, accum=f64)\n  mlp",
                                                                                  ")\n  mlp")).block("P")
    sites = [(s.kind, s.name, s.legal, s.into, s.code) for s in fold_report(block, "infer")]
    assert sites == [
        ("statistics", "norm1", True, ("attn.q_proj.weight", "attn.q_proj.bias", "attn.k_proj.weight",
                                       "attn.k_proj.bias", "attn.v_proj.weight", "attn.v_proj.bias"), None),
        ("statistics", "norm2", False, (), "live_statistics")]
    assert {s.code for s in fold_report(block, "train")} == {"training"}


def test_keys_name_the_buffers_with_the_module() -> None:
    program, m = _compile()
    from blockir.analyses.keys import param_keys
    table = param_keys(program, "P", DIMS)
    assert sorted(k.name for k in table.keys) == sorted(m.state_dict())


def _cli(*argv: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(list(argv)) == 0
    return out.getvalue()


def test_run_prints_the_transition_and_resumes_it(tmp_path: Path) -> None:
    data = tmp_path / "text.txt"
    data.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    example = str(ROOT / "examples" / "prepbn.block")
    small = ["--dims", "B=2,S=8", "--data", str(data), "--threads", "1"]
    first = _cli("run", example, "--steps", "2", "--save", str(tmp_path / "ck"), *small)
    assert "norm1                       step 2/1000  gamma 0.9980  running-stat age 2 batches (never calibrated)" \
        in first
    resumed = json.loads(_cli("run", example, "--steps", "1", "--resume", str(tmp_path / "ck"), "--format", "json",
                              *small))
    assert [(n["name"], n["step"], n["gamma"], n["running_stat_age"]) for n in resumed["batch_norms"]] == [
        ("norm1", 3, 0.997, 3), ("norm2", 3, 0.997, 3)]
    cal = _cli("calibrate", example, "--steps", "2", "--resume", str(tmp_path / "ck"), *small)
    assert cal.splitlines()[1:] == [
        "norm1                       step 2/1000  gamma 0.9980  running-stat age 0 batches (calibrated at batch 2)",
        "norm2                       step 2/1000  gamma 0.9980  running-stat age 0 batches (calibrated at batch 2)",
        "fold: refused: prepbn 'norm2' is at step 2 of its 1000-step transition (gamma = 0.998): its output still "
        "holds that share of LayerNorm, which the fold would drop"]


def test_manifest_names_the_family_its_row_reduction_and_schedule() -> None:
    from blockir.analyses.manifest import program_manifest
    block = program_manifest(blockir.load(ROOT / "examples" / "prepbn.block"))["blocks"]["PRepBNBlock"]
    assert block["topology"] == "pre_ln"
    assert block["norm"] == {"family": "prepbn", "placement": "pre_branch", "reduction_axes": ["B", "S"],
                             "epsilon": 1e-05, "center": True, "scale": "per_channel", "bias": True}
    assert block["norm_sites"][0]["batch_stats"] == {"padding": "mask", "momentum": 0.1, "running": True,
                                                     "rep": True, "transition_steps": 1000}


def test_cost_ledger_counts_parameters_not_buffers() -> None:
    from blockir.reports.cost import norm_parameters
    program = blockir.parse(BLOCK.format(steps=4).replace("norm2: prepbn(D, steps=4,", "norm2: batchnorm(D, rep=true,")
                            .replace(", ln_eps=1e-4, eta=0.5, accum=f64)\n  mlp", ", accum=f64)\n  mlp"))
    block = program.block("P")
    # PRepBN: LayerNorm weight and bias, BatchNorm weight and bias, eta; RepBN alone: 2 D + 1
    assert [norm_parameters(block.decl_map[n], {"D": 8}) for n in ("norm1", "norm2")] == [4 * 8 + 1, 2 * 8 + 1]
    _, m = _compile()
    assert sum(p.numel() for n, p in m.named_parameters() if n.startswith("norm1.")) == 4 * 8 + 1


def test_include_policy_counts_every_row_and_unreadable_masks_are_refused() -> None:
    program = blockir.parse(BLOCK.format(steps=4).replace("padding=mask", "padding=include"))
    m = blockir.compile(program, "P", dims=DIMS).double()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    keep = torch.ones(3, 5, dtype=torch.long)
    keep[0, 3:] = 0
    m(x, attention_mask=keep)
    assert torch.allclose(m.norm1.bn.running_mean, 0.25 * x.reshape(-1, 8).mean(0), rtol=1e-13, atol=0)
    _, masked = _compile()
    with pytest.raises(blockir.BlockError) as bad:
        masked(x, attention_mask=torch.zeros(3, 5, dtype=torch.long))
    assert [(d.code, d.span.line) for d in bad.value.diagnostics] == [("E0750", 8)]
    assert "every row of the batch is padding" in bad.value.diagnostics[0].message
    with pytest.raises(blockir.BlockError) as additive:
        masked(x, attention_mask=torch.zeros(3, 1, 5, 5))
    assert "does not mark the rows of its input (3, 5, 8)" in additive.value.diagnostics[0].message


def test_calibrate_refuses_a_module_without_running_moments() -> None:
    with pytest.raises(blockir.BlockError) as none:
        blockir.calibrate(torch.nn.Linear(2, 2), [torch.randn(1, 2)])
    assert [d.code for d in none.value.diagnostics] == ["E0753"]
    _, m = _compile()
    with pytest.raises(blockir.BlockError) as empty:
        blockir.calibrate(m, [])
    assert [d.code for d in empty.value.diagnostics] == ["E0753"]
