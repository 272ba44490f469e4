"""nGPT's applied scales in the run report: every eigen rate, s_qk and s_z equal the stored parameters of the
checkpoint the run saved times their constants."""
from __future__ import annotations

import json

import torch

from blockir.cli import main
from conftest import ROOT

D = 16
TEXT = (ROOT / "examples" / "ngpt.block").read_text().replace("dim D: model = 64", f"dim D: model = {D}") \
    .replace("layers: NGPTLayer * 8", "layers: NGPTLayer * 2")


def test_run_reports_the_applied_eigen_rates_and_scales(tmp_path, capsys) -> None:
    path, data = tmp_path / "ngpt.block", tmp_path / "text.txt"
    path.write_text(TEXT)
    data.write_bytes(bytes(range(32, 127)) * 200)
    args = [str(path), "--steps", "2", "--dims", "B=2,S=8", "--data", str(data), "--lr", "0.05"]
    assert main(["run", *args, "--save", str(tmp_path / "ck"), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)["ngpt_scales"]
    state = torch.load(tmp_path / "ck" / "model.pt", weights_only=True)
    rate = 0.05 / D ** -0.5  # alpha_init / alpha_scale: the constant the block multiplies alpha by
    want = []
    for i in range(2):
        want.append((f"layers.{i}.attn", "s_qk", state[f"core.layers.{i}.attn.qk_scale"].double() * D ** 0.5))
        want += [(f"layers.{i}.step_{b}", "eigen_rate", state[f"core.layers.{i}.alpha_{b}"].double() * rate)
                 for b in "am"]
    want.append(("logits", "s_z", state["logit_scale"].double() * D ** 0.5))
    assert [(r["site"], r["kind"]) for r in report] == [(site, kind) for site, kind, _ in want]
    for r, (_, _, applied) in zip(report, want):
        a = applied
        assert (r["min"], r["max"]) == (float(a.min()), float(a.max()))
        assert abs(r["mean"] - float(a.mean())) < 1e-12
    # two steps at this rate move the rates off their common initial 0.05
    assert report[1]["min"] < 0.05 < report[1]["max"]
