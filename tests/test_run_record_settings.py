"""``run.json`` records how a run stepped (``--accum``, ``--dtype``, ``--device``), and a resume that would step
otherwise is refused at the recorded field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from blockir.cli import main  # noqa: E402

TINY = """\
dim B: batch
dim S: seq
dim D: model = 16
dim F: hidden = 32

block Layer(x: [B, S, D]) -> [B, S, D] {
  ln: rmsnorm(D)
  mlp: mlp(F, act=gelu)
  return x + mlp(ln(x))
}

model Stack(x: [B, S, D]) -> [B, S, D] {
  layers: Layer * 1
  norm: rmsnorm(D)
  return norm(layers(x))
}
"""
COMMON = ["--dims", "B=2,S=8", "--steps", "1"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("settings")
    program = folder / "tiny.block"
    program.write_text(TINY)
    assert main(["run", str(program), *COMMON, "--accum", "2", "--save", str(folder / "ckpt")]) == 0
    return program, folder / "ckpt"


def test_the_record_holds_accum_dtype_and_device(saved) -> None:
    config = json.loads((saved[1] / "run.json").read_text())["config"]
    assert (config["accum"], config["dtype"], config["device"]) == (2, "fp32", None)


@pytest.mark.parametrize("option, recorded, asked", [(["--accum", "1"], "--accum 2", "--accum 1"),
                                                     (["--accum", "2", "--dtype", "bf16"], "--dtype fp32",
                                                      "--dtype bf16")])
def test_a_resume_that_steps_otherwise_is_refused_at_the_field(saved, capsys, option, recorded, asked) -> None:
    program, ckpt = saved
    assert main(["run", str(program), *COMMON, "--resume", str(ckpt), *option]) == 1
    err = capsys.readouterr().err
    field = asked.split()[0][2:]
    assert f"{ckpt / 'run.json'}: config.{field}: error[E0849]: the checkpoint was trained with {recorded}; " \
           f"this run asks for {asked}" in err
    assert f"hint: resume with {recorded}" in err and "Traceback" not in err


def test_the_same_stepping_resumes_and_an_older_record_without_it_still_does(saved, capsys, tmp_path) -> None:
    program, ckpt = saved
    assert main(["run", str(program), *COMMON, "--resume", str(ckpt), "--accum", "2"]) == 0
    assert f"resumed {ckpt} at step 1" in capsys.readouterr().err
    old = tmp_path / "old"
    old.mkdir()
    for f in ckpt.iterdir():
        (old / f.name).write_bytes(f.read_bytes())
    record = json.loads((old / "run.json").read_text())
    for key in ("accum", "dtype", "device"):
        del record["config"][key]
    (old / "run.json").write_text(json.dumps(record))
    assert main(["run", str(program), *COMMON, "--resume", str(old)]) == 0
