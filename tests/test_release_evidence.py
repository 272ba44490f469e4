"""What a calibration and a release record as evidence, each number recomputed here from the saved state:
the calibration batches' sha256 and the fold error, and every conformance check's tolerance and error."""
from __future__ import annotations

import hashlib
import io
import json
from contextlib import redirect_stdout
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

import blockir
from blockir.cli import main
from blockir.lifecycle import checkpoint
from blockir.lifecycle.corpus import fixed_starts, load_corpus
from blockir.lifecycle.session import RunConfig, build_model
from blockir.lower.fold import apply_folds
from conftest import ROOT

TEXT = (ROOT / "examples" / "prepbn.block").read_text().replace("steps=1000", "steps=2") \
    .replace("dim D: model = 64", "dim D: model = 16")
DIMS = {"B": 2, "S": 8}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("evidence")
    (d / "p.block").write_text(TEXT)
    (d / "text.txt").write_bytes((ROOT / "blockir" / "cli.py").read_bytes())
    assert main(["run", str(d / "p.block"), "--dims", "B=2,S=8", "--steps", "3", "--data", str(d / "text.txt"),
                 "--save", str(d / "ck")]) == 0
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["calibrate", str(d / "p.block"), "--resume", str(d / "ck"), "--steps", "2", "--data",
                     str(d / "text.txt"), "--save", str(d / "cal"), "--format", "json"]) == 0
    (d / "calibrate.json").write_text(out.getvalue())
    return d


def _model(ck: Path, backend: str = "fx"):
    record, state = checkpoint.read_record(ck), checkpoint.read_state(ck)
    program = blockir.parse((ck / "program.block").read_text())
    model, _ = build_model(program, program.block(record["block"]), replace(RunConfig(**record["config"]),
                                                                           backend=backend))
    model.load_state_dict(state["model"])
    return program, model.eval(), record


def test_calibration_records_its_batches_and_the_fold_error(lab: Path) -> None:
    report = json.loads((lab / "calibrate.json").read_text())
    train = load_corpus(str(lab / "text.txt")).train
    width = DIMS["S"] + 1
    starts = fixed_starts(train, 2 * DIMS["B"], width).tolist()
    assert report["batches_sha256"] == hashlib.sha256(b"".join(bytes(train[s:s + width].tolist())
                                                               for s in starts)).hexdigest()
    program, model, _ = _model(lab / "cal")
    folded = apply_folds(program, "PRepBNBlock", model.core, dims=DIMS).module.eval()
    windows = torch.stack([train[s:s + width].long() for s in starts])
    error = 0.0
    with torch.no_grad():
        for batch in windows.split(DIMS["B"]):
            inputs, _ = model.split(batch)
            error = max(error, float((folded(*inputs).double() - model.core(*inputs).double()).abs().max()))
    # norm1 feeds an attention without biases, where the shift has nowhere to go: only norm2 folds
    assert report["fold"] == {"max_error": error, "folded": ["norm2"], "refused": None}
    assert 0 < error < 1e-5
    saved = json.loads((lab / "cal" / "calibration.json").read_text())
    assert (saved["batches_sha256"], saved["fold"]) == (report["batches_sha256"], report["fold"])


def test_a_fold_before_the_transition_ends_is_recorded_as_refused(lab: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["calibrate", str(lab / "p.block"), "--dims", "B=2,S=8", "--steps", "1", "--data",
                 str(lab / "text.txt"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["fold"] == {
        "max_error": None, "folded": [], "refused": "prepbn 'norm2' is at step 0 of its 2-step transition (gamma = 1): "
                                                    "its output still holds that share of LayerNorm, which the fold "
                                                    "would drop"}


def test_release_attaches_each_conformance_check_and_the_calibration(lab: Path) -> None:
    assert main(["release", str(lab / "cal"), "--out", str(lab / "rel")]) == 0
    manifest = yaml.safe_load((lab / "rel" / "release.yaml").read_text())
    calibration = manifest["evidence"]["calibration_report"]
    saved = json.loads((lab / "cal" / "calibration.json").read_text())
    assert calibration == {"file": "calibration.json", "sha256": manifest["files"]["calibration.json"], **saved}
    checks = manifest["evidence"]["conformance_report"]["checks"]
    assert [(c["check"], c["ran"], c["passed"]) for c in checks] == [
        ("verifiers", True, True), ("forward", True, True), ("fused", True, True), ("bf16", True, True),
        ("distributed", False, None)]
    _, eager, record = _model(lab / "cal")
    _, fused, _ = _model(lab / "cal", "fused")
    window = torch.randint(0, 256, (2, eager.shape.window),
                           generator=torch.Generator().manual_seed(record["config"]["seed"]))
    with torch.no_grad():
        reference = eager.logits(window)[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = eager.logits(window)[0].float()
        others = {"fused": (fused.logits(window)[0], 1e-5, 1e-5), "bf16": (low, 1e-2, 2.0 ** -6)}
    peak = float(reference.double().abs().max())
    for c in checks[2:4]:
        got, atol, rtol = others[c["check"]]
        assert c["tolerance"] == atol + rtol * peak
        assert c["measured_error"] == float((got.double() - reference.double()).abs().max())
    assert checks[1]["measured_error"] == 0.0 and checks[0]["measured_error"] == 0.0
    # a checkpoint with running moments that were never calibrated says so
    assert main(["release", str(lab / "ck"), "--out", str(lab / "raw")]) == 0
    raw = yaml.safe_load((lab / "raw" / "release.yaml").read_text())["evidence"]["calibration_report"]
    assert raw == "none: the running statistics were never calibrated (blockir calibrate --save)"
