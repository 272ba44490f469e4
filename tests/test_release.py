"""Release artifacts and the canary: manifest fields, immutability, a planted regression, rollback."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from blockir.lifecycle import checkpoint
from blockir.cli import load_program, main

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / "examples" / "llama.block"
FAST = ["--max-latency-ratio", "1000"]  # a shared CPU's timing noise is not what these tests check


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("release")
    (d / "data.txt").write_bytes((ROOT / "blockir" / "cli.py").read_bytes() * 4)
    assert main(["run", str(LLAMA), "--dims", "B=2,S=16", "--steps", "2", "--data", str(d / "data.txt"),
                 "--save", str(d / "ck")]) == 0
    return d


def _release(lab: Path, ckpt: str, out: str, *extra: str) -> dict:
    assert main(["release", str(lab / ckpt), "--out", str(lab / out), "--format", "json", *extra]) == 0
    return yaml.safe_load((lab / out / "release.yaml").read_text())


def test_release_manifest_fields(lab: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    m = _release(lab, "ck", "r1", *FAST)
    assert json.loads(capsys.readouterr().out) == m  # the printed manifest is the written one
    assert m["architecture"] == {"block": "LlamaModel", "topology": "pre_ln",
                                 "branch_order": ["causal_self_attention", "gated_mlp"], "layers": 2,
                                 "final_norm": True}
    assert m["normalization"] == {"family": "rmsnorm", "axes": ["D"], "epsilon": 1e-6, "work_dtype": "f32"}
    assert m["residual"] == {"dtype": "parameter dtype (f32)", "dropout_probability": 0.0,
                             "scaling_recipe": "baseline"}
    assert m["runtime"]["backend"] == "fx" and m["runtime"]["dims"] == {"B": 2, "S": 16}
    record = json.loads((lab / "ck" / "run.json").read_text())
    assert m["state"]["checkpoint_hash"] == record["sha256"]["model.pt"]
    assert m["state"]["optimizer_hash"] == record["sha256"]["optimizer.pt"]
    assert m["state"]["rng_and_schedule_counters_hash"] == record["sha256"]["counters.pt"]
    assert m["state"]["step"] == 2 and m["state"]["data_sha256"] == record["data_sha256"]
    assert m["evidence"]["conversion_report"].startswith("none")
    checks = {c["check"]: c for c in m["evidence"]["conformance_report"]["checks"]}
    assert (checks["verifiers"]["measured_error"], checks["verifiers"]["passed"]) == (0.0, True)
    assert m["rollback"] == {"previous_artifact": None, "previous_artifact_hash": None,
                             "trigger_thresholds": {"max_logit_error": 1e-4, "max_loss_increase": 0.0,
                                                    "max_latency_ratio": 1000.0, "max_memory_ratio": 1.1,
                                                    "max_non_finite": 0}}
    assert set(m["files"]) == {"program.block", "model.pt", "optimizer.pt", "counters.pt", "run.json"}
    assert m["block_manifest"]["blocks"]["LlamaDecoderLayer"]["topology"] == "pre_ln"
    assert not (lab / "r1" / "model.pt").stat().st_mode & 0o222  # read-only
    # written once: a second release into the same directory is refused
    assert main(["release", str(lab / "ck"), "--out", str(lab / "r1")]) == 1
    assert "error[E0728]" in capsys.readouterr().err


def _planted(lab: Path, name: str, scale: float) -> None:
    """A copy of the checkpoint with one MLP matrix scaled: the regression a canary must catch."""
    record = checkpoint.read_record(lab / "ck")
    state = checkpoint.read_state(lab / "ck")
    state["model"]["core.layers.1.mlp.down_proj.weight"] *= scale
    checkpoint.write(lab / name, load_program(str(lab / "ck" / "program.block")), record["block"], record["file"],
                     record["config"], {"data": record["data"], "data_sha256": record["data_sha256"]}, state)


def test_canary_passes_identical_and_fails_a_planted_regression(lab: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not (lab / "r1").exists():
        _release(lab, "ck", "r1", *FAST)
    m = _release(lab, "ck", "same", "--previous", str(lab / "r1"), *FAST)
    assert m["rollback"]["previous_artifact"] == str(lab / "r1")
    slot = lab / "slot"
    capsys.readouterr()
    assert main(["canary", str(lab / "r1"), str(lab / "same"), "--data", str(lab / "data.txt"),
                 "--slot", str(slot), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and {c["check"]: c["value"] for c in report["checks"]}["logit_error"] == 0.0
    assert (slot / "release.yaml").read_bytes() == (lab / "same" / "release.yaml").read_bytes()

    _planted(lab, "bad_ck", 4.0)
    _release(lab, "bad_ck", "bad", "--previous", str(lab / "same"), *FAST)
    capsys.readouterr()
    assert main(["canary", str(lab / "same"), str(lab / "bad"), "--data", str(lab / "data.txt"),
                 "--slot", str(slot), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    breached = {c["check"] for c in report["checks"] if c["breached"]}
    assert "logit_error" in breached and not report["passed"]
    assert report["slot"].startswith("rolled back")
    # rollback restores the whole previous artifact, byte for byte: graph, weights, optimizer, counters
    for name in ("release.yaml", "program.block", "model.pt", "optimizer.pt", "counters.pt", "run.json"):
        assert (slot / name).read_bytes() == (lab / "same" / name).read_bytes()


def test_canary_refuses_a_tampered_or_unrelated_artifact(lab: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not (lab / "r1").exists():
        _release(lab, "ck", "r1", *FAST)
    _release(lab, "ck", "unrelated", *FAST)  # no rollback pointer to r1
    capsys.readouterr()
    assert main(["canary", str(lab / "r1"), str(lab / "unrelated"), "--data", str(lab / "data.txt")]) == 1
    assert "does not name" in capsys.readouterr().err
    tampered = lab / "tampered"
    _release(lab, "ck", "tampered", "--previous", str(lab / "r1"), *FAST)
    (tampered / "model.pt").chmod(0o644)
    state = torch.load(tampered / "model.pt", weights_only=True)
    state["head.weight"] += 1
    torch.save(state, tampered / "model.pt")
    assert main(["canary", str(lab / "r1"), str(tampered), "--data", str(lab / "data.txt")]) == 1
    assert "model.pt does not match the sha256 in release.yaml" in capsys.readouterr().err
