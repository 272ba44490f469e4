"""PowerNorm against a float64 oracle written from Algorithm 1 of Shen et al., "PowerNorm: Rethinking
Batch Normalization in Transformers" (ICML 2020): the relaxed forward, the approximate backward and its
running correction, inference under the running quadratic mean; calibration, the fold, the keys."""
from __future__ import annotations

import pytest
import torch

import blockir
from blockir.lower.layers.norm_module import make_norm
from blockir.ops import NormOp
from blockir.lower.fold import apply_folds

D, EPS, M = 8, 1e-3, 0.25
DIMS = {"B": 3, "S": 5, "D": D}
BLOCK = """dim B: batch
dim S: seq
dim D: model = 8
dim F: hidden = 16

block P(x: [B, S, D]) -> [B, S, D] {
  norm: powernorm(D, padding=mask, momentum=0.25, eps=1e-3, accum=f64)
  mlp: mlp(F, act=gelu)
  y = x + mlp(norm(x))
  return y
}
"""


def _x(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2 + 0.5


def _norm() -> torch.nn.Module:
    m = make_norm("powernorm", D, padding="mask", momentum=M, eps=EPS, accum="f64").double()
    with torch.no_grad():
        m.weight.copy_(1 + 0.3 * _x(90, D))
        m.bias.copy_(0.3 * _x(91, D))
    return m


def oracle(x: torch.Tensor, keep: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
           psi2: torch.Tensor, nu: torch.Tensor) -> dict[str, torch.Tensor]:
    """One training step of Algorithm 1 with the loss sum(y * r), written out (no autograd)."""
    rows, grad = x.reshape(-1, D), r.reshape(-1, D)
    psi2_batch = (rows[keep] ** 2).mean(0)
    z = rows / torch.sqrt(psi2 + EPS)  # the running value of the previous step
    g = w * grad  # dL/dx̂
    g_relaxed = g - nu * z * keep[:, None]
    gamma, lam = (z[keep] ** 2).mean(0), (z[keep] * g[keep]).mean(0)
    return {"y": (w * z + b).reshape(x.shape), "dx": (g_relaxed / torch.sqrt(psi2 + EPS)).reshape(x.shape),
            "dw": (grad * z).sum(0), "db": grad.sum(0), "psi2": (1 - M) * psi2 + M * psi2_batch,
            "nu": nu * (1 - M * gamma) + M * lam}


def test_training_steps_match_the_algorithm() -> None:
    m = _norm()
    psi2, nu = torch.ones(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64)
    for t in range(3):
        mask = torch.ones(3, 5, dtype=torch.long)
        mask[t, 3:] = 0  # padded rows: no part in ψ², Γ, Λ and no ν correction
        x, r = _x(t, 3, 5, D).requires_grad_(), _x(10 + t, 3, 5, D)
        want = oracle(x.detach(), mask.reshape(-1) != 0, r, m.weight.detach(), m.bias.detach(), psi2, nu)
        m.weight.grad = m.bias.grad = None
        y = m(x, attention_mask=mask)
        (y * r).sum().backward()
        for got, key in ((y, "y"), (x.grad, "dx"), (m.weight.grad, "dw"), (m.bias.grad, "db"),
                         (m.running_square, "psi2"), (m.running_nu, "nu")):
            torch.testing.assert_close(got, want[key], rtol=1e-12, atol=1e-12, msg=f"step {t}: {key}")
        psi2, nu = want["psi2"], want["nu"]
    assert int(m.num_batches_tracked) == 3


def test_inference_divides_by_the_running_quadratic_mean() -> None:
    m = _norm()
    for t in range(2):
        m(_x(t, 3, 5, D))
    m.eval()
    x = _x(7, 2, 4, D)
    want = m.weight * x / torch.sqrt(m.running_square + EPS) + m.bias
    before = m.running_square.clone()
    torch.testing.assert_close(m(x), want, rtol=1e-13, atol=1e-13)
    assert torch.equal(m.running_square, before) and int(m.num_batches_tracked) == 2
    # no running state: every call divides by its own batch's quadratic mean, and the gradient is exact
    live = make_norm("powernorm", D, padding="include", running=False, accum="f64", eps=EPS).double()
    assert not list(live.buffers())
    x = _x(8, 3, 5, D).requires_grad_()
    y = live(x)
    torch.testing.assert_close(y, x / torch.sqrt((x.reshape(-1, D) ** 2).mean(0) + EPS), rtol=1e-13, atol=1e-13)
    assert torch.autograd.gradcheck(lambda v: live(v), (x,))


def test_a_compiled_block_keeps_the_state_calibrates_and_folds() -> None:
    program = blockir.parse(BLOCK)
    assert [d for d in blockir.verify(program) if d.is_error] == []
    torch.manual_seed(0)
    m = blockir.compile(program, "P", dims=DIMS).double()
    assert [k for k in m.state_dict() if k.startswith("norm.")] == [
        "norm.weight", "norm.bias", "norm.running_square", "norm.running_nu", "norm.num_batches_tracked",
        "norm.calibrated_at"]
    for t in range(2):
        m(_x(t, 3, 5, D)).sum().backward()
    assert m.norm.running_nu.abs().sum() > 0  # the backward moved the correction
    batches = [_x(20 + i, 3, 5, D) for i in range(3)]
    (state,) = blockir.calibrate(m, batches)
    assert (state.name, state.tracked, state.calibrated_at) == ("norm", 3, 3)
    torch.testing.assert_close(m.norm.running_square, torch.stack([(b.reshape(-1, D) ** 2).mean(0)
                                                                   for b in batches]).mean(0), rtol=1e-12, atol=0)
    m.eval()
    result = apply_folds(program, "P", m, dims=DIMS)
    assert [(e.site.name, e.rule) for e in result.report] == [("norm", "statistics-into-linears")]
    assert not any(isinstance(op, NormOp) for op in result.program.block("P").ops)
    x = _x(30, 3, 5, D)
    want = m(x)
    assert ((result.module(x) - want).norm() / want.norm()).item() <= 1e-12


def test_a_padding_policy_is_required() -> None:
    program = blockir.parse(BLOCK.replace("padding=mask, ", ""))
    assert [d.code for d in blockir.verify(program) if d.is_error] == ["E0435"]


@pytest.mark.parametrize("field", ["family", "center", "batch_stats"])
def test_manifest_names_it_uncentered_and_batch_coupled(field: str) -> None:
    from blockir.analyses.manifest import program_manifest
    (site,) = program_manifest(blockir.parse(BLOCK))["blocks"]["P"]["norm_sites"]
    assert site[field] == {"family": "powernorm", "center": False,
                           "batch_stats": {"padding": "mask", "momentum": 0.25, "running": True, "rep": False}}[field]
