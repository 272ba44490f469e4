"""The norm-family examples check clean under --werror and train: two steps of ``blockir run`` on each, with
finite losses, and PowerNorm's running quadratic means updated by exactly the two training batches."""
from __future__ import annotations

import json
import math

import pytest

from blockir.cli import main
from conftest import ROOT


@pytest.mark.parametrize("stem", ["partial_rmsnorm", "powernorm"])
def test_example_trains_two_steps(stem: str, tmp_path, capsys) -> None:
    data = tmp_path / "text.txt"
    data.write_bytes(bytes(range(32, 127)) * 200)
    args = [str(ROOT / "examples" / f"{stem}.block"), "--steps", "2", "--dims", "B=2,S=8", "--data", str(data)]
    assert main(["check", "--werror", args[0]]) == 0
    assert main(["run", *args, "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["losses"]) == 2 and all(math.isfinite(v) for v in (*report["losses"], report["val_loss"]))
    assert report["stand_ins"] == []
    ages = {n["name"]: n["running_stat_age"] for n in report["batch_norms"]}
    assert ages == ({f"layers.{i}.norm{j}": 2 for i in (0, 1) for j in (1, 2)} if stem == "powernorm" else {})
