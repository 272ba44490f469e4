"""Depth telemetry of `blockir run`: the second-moment ledger of each update, the mean drift at each norm,
the gradient profile by layer and weight group, and the init spread against the declared one."""
from __future__ import annotations

import io
import json
import math
import sys
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest
import torch

import blockir
from blockir.analyses.sizes import Sizes
from blockir.cli import main
from blockir.lifecycle.moments import drift, norm_drift, site_moments
from blockir.lifecycle.profile import GradProfile, init_stats, layer_paths
from blockir.lifecycle.telemetry import method_telemetry

PRE_LN = """
dim B: batch
dim S: seq
dim D: model = 16
dim F: hidden = 32
block L(x: [B, S, D]) -> [B, S, D] {
  const a = 1.5
  n1: layernorm(D, eps=0.25)
  attn: self_attention(heads=2, causal=true)
  n2: rmsnorm(D, eps=1e-6)
  mlp: mlp(F, act=gelu)
  h = a * x + attn(n1(x))
  y = h + mlp(n2(h))
  return y
}
model M(x: [B, S, D]) -> [B, S, D] {
  layers: L * 2
  k: dyt(D, alpha=0.5)
  return k(layers(x))
}
"""


def _traced() -> tuple[blockir.Program, dict[str, torch.Tensor]]:
    prog = blockir.parse(PRE_LN)
    m = blockir.compile(prog, "M", seed=0, dtype=torch.float64).eval()
    x = torch.randn(3, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) + 0.7
    with torch.no_grad():
        _, values = blockir.trace(m, x)
    return prog, values


def test_second_moment_identity_against_a_float64_oracle() -> None:
    prog, values = _traced()
    got = site_moments(prog, prog.block("M"), values, Sizes.of(prog, {}))
    assert [m.site for m in got] == ["layers.0.h", "layers.0.y", "layers.1.h", "layers.1.y"]
    for m, (shortcut, update) in zip(got, [("%0", "%2"), ("h", "%4")] * 2):
        layer = m.site.rsplit(".", 1)[0]
        if shortcut == "%0":  # the shortcut operand is the scaled state a * x, not x
            np.testing.assert_allclose(values[f"{layer}.%0"].numpy(), 1.5 * values[f"{layer}.x"].numpy())
        x = values[f"{layer}.{shortcut}"].numpy().reshape(-1, 16)
        u = values[f"{layer}.{update}"].numpy().reshape(-1, 16)
        y = values[m.site].numpy().reshape(-1, 16)
        ex2, eu2, ey2 = (float(np.mean(np.einsum("rd,rd->r", v, v))) for v in (x, u, y))
        cross = 2 * float(np.mean(np.einsum("rd,rd->r", x, u)))
        assert (m.ex2, m.eu2, m.cross, m.ey2) == pytest.approx((ex2, eu2, cross, ey2), rel=1e-13)
        assert (m.rms_x, m.rms_y) == pytest.approx((math.sqrt(np.mean(x * x)), math.sqrt(np.mean(y * y))), rel=1e-13)
        # E|y|^2 = E|x|^2 + E|u|^2 + 2E[x.u], with a cross term that is not negligible here
        assert abs(m.gap) <= 1e-12 * ey2 and abs(cross) > 1e-3 * ey2


def test_mean_drift_is_rms_squared_over_variance_plus_eps() -> None:
    rows = np.random.default_rng(0).normal(size=(40, 8)) + np.linspace(-3, 3, 40)[:, None]
    eps = 0.3
    rms2 = np.mean(rows ** 2, axis=-1) + eps  # the RMS with its epsilon under the root, squared
    var = np.var(rows, axis=-1)  # the biased variance LayerNorm uses
    np.testing.assert_allclose(drift(torch.from_numpy(rows), eps).numpy(), rms2 / (var + eps), rtol=1e-12)
    assert float(drift(torch.zeros(1, 8) + torch.arange(8.0), 0.0)) == pytest.approx(1 + 3.5 ** 2 / 5.25)


def test_norm_drift_at_every_norm_input_with_its_own_epsilon() -> None:
    prog, values = _traced()
    got = norm_drift(prog, prog.block("M"), values, Sizes.of(prog, {}))
    assert [(d.norm, d.site, d.eps) for d in got] == [
        ("layers.0.n1", "layers.0.x", 0.25), ("layers.0.n2", "layers.0.h", 1e-6),
        ("layers.1.n1", "layers.1.x", 0.25), ("layers.1.n2", "layers.1.h", 1e-6),
        ("k", "%0", 0.0)]  # DyT has no epsilon
    for d in got:
        x = values[d.site].numpy().reshape(-1, 16)
        ratio = (np.mean(x ** 2, -1) + d.eps) / (np.var(x, -1) + d.eps)
        assert d.drift == pytest.approx(tuple(np.quantile(ratio, (0.5, 0.9, 0.99))), rel=1e-12)
    assert got[0].drift[0] > 1.2  # the input is shifted by 0.7: its rows are far from zero-mean


def test_gradient_profile_by_layer_and_weight_group() -> None:
    prog = blockir.parse(PRE_LN)
    m = blockir.compile(prog, "M", seed=0, dtype=torch.float64)
    layers = [p[:-1] for p in layer_paths(prog, prog.block("M"), Sizes.of(prog, {}))]
    assert layers == ["layers.0", "layers.1"]
    profile = GradProfile(layers)
    x = torch.randn(2, 4, 16, dtype=torch.float64)
    for step in (1, 2):
        m.zero_grad()
        (m(x) ** 2).sum().backward()
        profile.record(step, list(m.named_parameters()))
    grads = dict(m.named_parameters())
    for i in range(2):
        own = [p.grad.flatten() for name, p in grads.items() if name.startswith(f"layers.{i}.")]
        assert profile.layer_norms[-1][i] == pytest.approx(float(torch.cat(own).norm()), rel=1e-12)
    assert profile.steps == [1, 2] and "attn.v_proj.weight" in profile.groups
    assert profile.group_norms["mlp.fc2.weight"][1][1] == pytest.approx(float(m.layers[1].mlp.fc2.weight.grad.norm()))
    assert set(profile.outside) == {"k.alpha", "k.weight", "k.bias"}


INITS = """
dim B: batch
dim S: seq
dim D: model = 32
dim F: hidden = 64
block L(x: [B, S, D]) -> [B, S, D] {
  const beta = (8 * num_layers) ** -0.25
  const m = (2 * num_layers) ** -0.5
  attn: self_attention(heads=2, causal=true, init_gain=beta)
  mlp: mlp(F, act=relu, init_scale=m, init_zero=true)
  gm: gated_mlp(F, act=silu, init_std=fan_in)
  h = x + attn(x)
  z = h + mlp(h)
  y = z + gm(z)
  return y
}
model M(x: [B, S, D]) -> [B, S, D] {
  layers: L * 3
  return layers(x)
}
"""


def test_init_spread_against_the_declared_one() -> None:
    prog = blockir.parse(INITS)
    core = blockir.compile(prog, "M", seed=0)
    stats = {s.param: s for s in init_stats(prog, prog.block("M"), core, Sizes.of(prog, {}))}
    beta, rescale = 24 ** -0.25, 6 ** -0.5
    want = {  # closed forms: Xavier-normal g*sqrt(2/(in+out)), PyTorch's default 1/sqrt(3 in), N(0, k/in)
        "attn.q_proj": math.sqrt(2 / 64), "attn.v_proj": beta * math.sqrt(2 / 64), "attn.o_proj": beta * math.sqrt(2 / 64),
        "mlp.fc1": rescale / math.sqrt(3 * 32), "mlp.fc2": 0.0,
        "gm.gate_proj": math.sqrt(2 / 32), "gm.up_proj": math.sqrt(2 / 32), "gm.down_proj": math.sqrt(1 / 64)}
    for i in range(3):
        for name, std in want.items():
            s = stats[f"layers.{i}.{name}.weight"]
            assert s.layer == f"layers.{i}" and s.stated == pytest.approx(std, rel=1e-12), s
            if std:
                assert s.ratio == pytest.approx(1.0, abs=0.06), s  # 1024+ draws: a few percent of sampling error
            else:
                assert s.std == 0.0
    assert stats["layers.0.mlp.fc2.weight"].rule == "init_zero"
    with torch.no_grad():
        core.layers[2].attn.v_proj.weight.mul_(2.0)  # an init that ignores its declaration is seen
    (planted,) = [s for s in init_stats(prog, prog.block("M"), core, Sizes.of(prog, {}))
                  if s.param == "layers.2.attn.v_proj.weight"]
    assert planted.ratio == pytest.approx(2 * stats["layers.2.attn.v_proj.weight"].ratio, rel=1e-12)


def _small(tmp_path) -> list[str]:
    """Two steps of two 8-byte windows on a small text (reading the standard library would dominate)."""
    data = tmp_path / "text.txt"
    data.write_bytes(bytes(range(32, 127)) * 200)
    return ["--steps", "2", "--dims", "B=2,S=8", "--data", str(data)]


def test_run_profile_json_and_table(tmp_path, monkeypatch) -> None:
    path = tmp_path / "m.block"
    path.write_text(PRE_LN)
    base = [str(path), *_small(tmp_path)]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["run", *base, "--profile", "--format", "json"])
    assert code == 0, err.getvalue()
    report = json.loads(out.getvalue())
    assert [m["site"] for m in report["moments"]] == ["layers.0.h", "layers.0.y", "layers.1.h", "layers.1.y"]
    for m in report["moments"]:
        assert m["mean_sq_y"] == pytest.approx(m["mean_sq_x"] + m["mean_sq_u"] + m["cross"], rel=1e-6)
    assert [d["norm"] for d in report["norm_drift"]] == ["layers.0.n1", "layers.0.n2", "layers.1.n1", "layers.1.n2",
                                                         "k"]
    grads = report["profile"]["gradients"]
    assert grads["layers"] == ["layers.0", "layers.1"] and grads["steps"] == [1, 2]
    for step in range(2):
        for i in range(2):
            groups = [grads["group_grad_norm"][g][step][i] for g in grads["group_grad_norm"]]
            assert grads["layer_grad_norm"][step][i] == pytest.approx(math.sqrt(sum(v * v for v in groups)))
    assert {"embed.weight", "head.weight", "k.alpha"} <= set(grads["outside_grad_norm"])
    assert all(s["stated"] is None for s in report["profile"]["init"])  # PRE_LN states no initialisation
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        assert main(["run", *base, "--profile"]) == 0
    text = out.getvalue()
    assert "RMS(x)    RMS(y)      E|x|^2" in text and "drift p50" in text and "grad step 1" in text
    # without matplotlib, --plot stops before training, and writes nothing
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err), pytest.raises(SystemExit) as stop:
        main(["run", *base, "--plot", str(tmp_path / "p.png")])
    assert str(stop.value) == "blockir: --plot needs matplotlib (pip install 'blockir[plot]')"
    assert "step 1" not in err.getvalue() and not (tmp_path / "p.png").exists()


def test_plot_draws_the_gradient_profile_panel(tmp_path) -> None:
    """Every panel is 3.3 inches tall at 110 dpi: loss, rho, cos, and the profile."""
    import matplotlib.image as matplotlib_image
    path, out = tmp_path / "m.block", tmp_path / "run.png"
    path.write_text(PRE_LN.replace("dyt(D, alpha=0.5)", "rmsnorm(D)"))  # DyT would add a method panel
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        assert main(["run", str(path), *_small(tmp_path), "--profile", "--plot", str(out)]) == 0
    assert matplotlib_image.imread(out).shape[0] == round(3.3 * 110 * 4)


def test_dyt_input_range_and_slope_distribution() -> None:
    prog = blockir.parse("""
dim B: batch
dim S: seq
dim D: model = 8
block T(x: [B, S, D]) -> [B, S, D] {
  n: dyt(D, alpha=0.8)
  lin: linear(D, D)
  y = x + lin(n(x))
  return y
}""")
    m = blockir.compile(prog, "T", seed=0, dtype=torch.float64)
    x = torch.linspace(-4.0, 3.0, 200, dtype=torch.float64).reshape(5, 5, 8)
    with torch.no_grad():
        _, values = blockir.trace(m, x)
    (stat,) = method_telemetry(prog, prog.block("T"), m, values, Sizes.of(prog, {}))
    assert stat.input_range == (-4.0, 3.0)
    ax = float(m.n.alpha.detach()) * x.numpy().reshape(-1)  # alpha as the module holds it
    slope = 1 - np.tanh(ax) ** 2  # d tanh(ax)/d(ax)
    assert stat.slope == pytest.approx(tuple(np.quantile(slope, (0.01, 0.5, 0.99))), rel=1e-12)
    assert stat.saturated == pytest.approx(float(np.mean(np.abs(ax) > 2)))
