"""Interrupts at every write boundary: the destination holds its old whole or its new whole, nothing else.

Three ways in: the write hook sends the process SIGTERM or SIGINT at its K-th boundary while the
command runs in-process (every boundary of run, migrate and release); a real child process is
SIGKILLed at every boundary of the directory writer, and what the next command finds is checked; and
a real ``blockir run`` is sent SIGINT from outside mid-training.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from blockir.lifecycle import atomic, checkpoint
from lifecycle_lab import DIMS, FAST, ROOT_ENV, build, cli, copy, leftovers, snapshot

# run replaces a checkpoint (5 files, staging done, old set aside, new in place); migrate and release write a new
# directory (6 files, staging done, new in place). From staging done on, SIGINT and SIGTERM wait out the swap.
LAST = 8
HELD_FROM = {"run": 6, "migrate": 7, "release": 7}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("signals"))


def _command(lab: Path, name: str, dest: Path) -> list[str | Path]:
    if name == "run":  # replaces an existing checkpoint: the old one must survive every interrupt before the swap
        return ["run", lab / "tiny.block", *DIMS, "--data", lab / "data.txt", "--steps", "1", "--resume", dest,
                "--save", dest]
    if name == "migrate":
        return ["migrate", lab / "tiny.block", lab / "renamed.block", "--checkpoint", lab / "ck", "--map",
                lab / "map.yaml", "--out", dest]
    return ["release", lab / "ck2", "--out", dest, "--previous", lab / "r1", *FAST]


@pytest.mark.parametrize("name, k", [(n, k) for n in HELD_FROM for k in range(1, LAST + 2)])
def test_an_interrupt_at_every_write_boundary_leaves_a_whole_directory(lab: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      name: str, k: int) -> None:
    dest = copy(lab / "ck", tmp_path / "ck") if name == "run" else tmp_path / "out"
    before = snapshot(dest)
    monkeypatch.setenv(atomic.KILL_AT, str(k))
    monkeypatch.setenv(atomic.KILL_SIGNAL, "INT" if k % 2 else "TERM")
    code, _, err = cli(*_command(lab, name, dest))
    monkeypatch.delenv(atomic.KILL_AT)
    assert leftovers(tmp_path) == []
    if k > LAST:  # past the last boundary: the command completed
        assert code == 0, err
    else:
        signame = "SIGINT" if k % 2 else "SIGTERM"
        assert code == 128 + signal.Signals[signame] and "Traceback" not in err
        assert err.splitlines()[-1].startswith(f"blockir: interrupted by {signame}; ")
    if k < HELD_FROM[name]:
        assert snapshot(dest) == before  # the old whole, byte for byte (or still nothing)
    else:  # the signal waited out the swap: the new whole, every hash checked
        assert checkpoint.read_record(dest)["step"] == (1 if name == "migrate" else 2)


# the writer alone, loaded from its file (it needs only the standard library): a child that starts in milliseconds
KILLER = """
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("atomic", sys.argv[3])
atomic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(atomic)
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
atomic.publish(dst, {p.name: p.read_bytes() for p in sorted(src.iterdir())})
"""


@pytest.mark.parametrize("k", range(1, 9))
def test_a_hard_kill_at_every_boundary_is_recovered_by_the_next_command(lab: Path, tmp_path: Path, k: int) -> None:
    dest = copy(lab / "ck", tmp_path / "ck")
    old, new = snapshot(dest), snapshot(copy(lab / "ck2", tmp_path / "new"))
    env = {**os.environ, **ROOT_ENV, atomic.KILL_AT: str(k), atomic.KILL_SIGNAL: "KILL"}
    proc = subprocess.run([sys.executable, "-c", KILLER, str(tmp_path / "new"), str(dest), atomic.__file__], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # what the next command sees: it recovers first, then reads
    record = checkpoint.read_record(dest)
    assert leftovers(tmp_path) == []
    now = {p.replace(str(tmp_path / "new"), str(dest)): v for p, v in new.items()}
    assert snapshot(dest) == (old if k <= 7 else now)  # at 7 the old whole was set aside: it is put back
    assert record["step"] == (1 if k <= 7 else 2)


def test_sigint_from_outside_during_training_keeps_the_checkpoint(lab: Path, tmp_path: Path) -> None:
    ck = copy(lab / "ck", tmp_path / "ck")
    before = snapshot(ck)
    proc = subprocess.Popen([sys.executable, "-m", "blockir", "run", str(lab / "tiny.block"), *DIMS, "--data",
                             str(lab / "data.txt"), "--steps", "1000000", "--resume", str(ck), "--save", str(ck)],
                            env={**os.environ, **ROOT_ENV}, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True)
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("step 2/"):
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130
    assert "Traceback" not in rest
    assert rest.strip().splitlines()[-1] == f"blockir: interrupted by SIGINT; {ck} holds a complete checkpoint " \
        "(step 1); no partial files were left"
    assert snapshot(ck) == before and leftovers(tmp_path) == []
    assert json.loads((ck / "run.json").read_text())["step"] == 1


@pytest.mark.parametrize("k, kept", [(3, "old"), (7, "new")])
def test_calibrate_interrupted_while_saving_keeps_a_whole_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   k: int, kept: str) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "prepbn.block"
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog. " * 40)
    small = ["--dims", "B=2,S=8", "--data", tmp_path / "text.txt"]
    assert cli("run", example, "--steps", "1", "--save", tmp_path / "ck", *small)[0] == 0
    before = snapshot(tmp_path / "ck")
    monkeypatch.setenv(atomic.KILL_AT, str(k))
    code, _, err = cli("calibrate", example, "--steps", "1", "--resume", tmp_path / "ck", "--save", tmp_path / "ck",
                       *small)
    assert code == 143 and err.splitlines()[-1] == f"blockir: interrupted by SIGTERM; {tmp_path / 'ck'} holds a " \
        "complete checkpoint (step 1); no partial files were left"
    assert leftovers(tmp_path) == []
    if kept == "old":
        assert snapshot(tmp_path / "ck") == before
    else:  # the calibrated whole: its moments were recomputed, so model.pt changed, and every hash checks
        assert snapshot(tmp_path / "ck") != before and checkpoint.read_record(tmp_path / "ck")["step"] == 1
