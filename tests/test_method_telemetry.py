"""Method telemetry: branch gates and DyT alpha, their gradients, and DyT's saturation fraction."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest
import torch

import blockir
from blockir.analyses.sizes import Sizes
from blockir.lifecycle.telemetry import method_telemetry
from blockir.cli import main
from conftest import ROOT


def test_rezero_gate_value_and_gradient() -> None:
    """At g = 0 the gate's gradient is <dL/dy, F_attn(x) + F_mlp(x)> (both updates read x)."""
    prog = blockir.load(ROOT / "examples" / "rezero.block")
    m = blockir.compile(prog, "ReZeroLayer", dims={"D": 16}, seed=0, dtype=torch.float64).eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    g = torch.randn(2, 5, 16, dtype=torch.float64)
    y, values = blockir.trace(m, x)
    (y * g).sum().backward()
    stats = method_telemetry(prog, prog.block("ReZeroLayer"), m, values, Sizes.of(prog, {"D": 16}))
    with torch.no_grad():
        want = abs(float((g * (m.self_attn(x) + m.mlp(x))).sum()))
    assert [(s.site, s.kind, s.value) for s in stats] == [("resweight", "gate", 0.0)]
    assert stats[0].grad_norm == pytest.approx(want, rel=1e-12)
    assert stats[0].saturated is None


def test_dyt_alpha_and_saturation_fraction() -> None:
    prog = blockir.parse("""
dim B: batch
dim S: seq
dim D: model = 4
block T(x: [B, S, D]) -> [B, S, D] {
  n: dyt(D, alpha=1.0)
  lin: linear(D, D)
  y = x + lin(n(x))
  return y
}""")
    m = blockir.compile(prog, "T", seed=0, dtype=torch.float64)
    x = torch.tensor([[[3.0, -2.5, 0.5, 1.9]]], dtype=torch.float64)  # |x| > 2 in 2 of 4 entries
    y, values = blockir.trace(m, x)
    stats = method_telemetry(prog, prog.block("T"), m, values, Sizes.of(prog, {}))
    assert [(s.site, s.kind, s.value, s.grad_norm, s.saturated) for s in stats] == [("n", "dyt", 1.0, None, 0.5)]
    with torch.no_grad():
        m.n.alpha.fill_(0.7)  # |0.7 x| > 2 only for x = 3
    y, values = blockir.trace(m, x)
    y.sum().backward()
    (stat,) = method_telemetry(prog, prog.block("T"), m, values, Sizes.of(prog, {}))
    assert stat.saturated == 0.25 and stat.value == pytest.approx(0.7)
    assert stat.grad_norm == pytest.approx(float(m.n.alpha.grad.abs().sum()), rel=1e-15)


def test_layerscale_gates_report_mean_magnitude_per_layer() -> None:
    prog = blockir.load(ROOT / "examples" / "layerscale.block")
    m = blockir.compile(prog, "LayerScaleEncoder", dims={"D": 16}, seed=0)
    _, values = blockir.trace(m, torch.randn(2, 3, 16))
    stats = method_telemetry(prog, prog.block("LayerScaleEncoder"), m, values, Sizes.of(prog, {"D": 16}))
    assert [s.site for s in stats[:3]] == ["blocks.0.ls1.gamma", "blocks.0.ls2.gamma", "blocks.1.ls1.gamma"]
    gamma = m.get_parameter("blocks.0.ls1.gamma")
    assert stats[0].value == pytest.approx(float(gamma.detach().abs().mean()))


def test_run_reports_method_parameters_in_json() -> None:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["run", str(ROOT / "examples" / "rezero.block"), "--steps", "1", "--dims", "B=2,S=8,D=16",
                     "--format", "json"])
    assert code == 0, err.getvalue()
    methods = json.loads(out.getvalue())["methods"]
    assert [m["parameter"] for m in methods] == [f"layers.{i}.resweight" for i in range(12)]
    assert all(m["kind"] == "gate" and m["grad_norm"] is not None and m["saturated"] is None for m in methods)


@pytest.mark.parametrize("example, panels", [
    ("prepbn", 4),  # loss, rho, cos, and PRepBN's gamma(t) against step
    ("ngpt", 5),  # ... the eigen-rate gates by depth, and the distance from the sphere against step
])
def test_plot_draws_a_panel_per_kind_of_method_measure(tmp_path, example: str, panels: int) -> None:
    """Every panel is 3.3 inches tall at 110 dpi, so the image height counts the panels drawn."""
    import matplotlib.image as matplotlib_image
    out = tmp_path / "run.png"
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        code = main(["run", str(ROOT / "examples" / f"{example}.block"), "--steps", "2", "--dims", "B=2,S=8",
                     "--plot", str(out)])
    assert code == 0
    assert matplotlib_image.imread(out).shape[0] == round(3.3 * 110 * panels)


def test_the_plot_draws_ngpts_eigen_rate_ranges_by_depth(tmp_path, monkeypatch) -> None:
    """Each update's applied eigen rate: its mean, with bars down to its least and up to its largest entry."""
    import matplotlib.axes
    drawn = []
    original = matplotlib.axes.Axes.errorbar

    def errorbar(self, x, y, yerr=None, **kw):  # type: ignore[no-untyped-def]
        drawn.append((list(x), list(y), yerr, kw.get("label")))
        return original(self, x, y, yerr=yerr, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", errorbar)
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        assert main(["run", str(ROOT / "examples" / "ngpt.block"), "--steps", "1", "--dims", "B=2,S=8",
                     "--plot", str(tmp_path / "run.png")]) == 0
    ((x, y, (below, above), label),) = drawn
    assert label.endswith("nGPT eigen rate (min–max)") and len(x) == len(y) >= 2
    assert all(b >= 0 and a >= 0 for b, a in zip(below, above)) and any(b + a > 0 for b, a in zip(below, above))
