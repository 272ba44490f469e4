"""Run checkpoints: everything that decides the next step, in files a release manifest can hash.

A checkpoint directory holds

- ``program.block`` — the program as printed (the graph; it parses back to the same IR),
- ``model.pt`` — the parameters (embedding, block, final norm, head),
- ``optimizer.pt`` — AdamW's moments and step counts,
- ``counters.pt`` — the schedule's counter, the step, torch's generator (dropout and
  stochastic-depth seeds) and the batch sampler's generator,
- ``run.json`` — the configuration, the corpus digest and the sha256 of every file above.

Resuming refuses a checkpoint whose program, sizes or data differ from the run that continues it:
the same bytes in must give the same bytes out.
"""
from __future__ import annotations

import hashlib
import io
import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from blockir.backends.session import RunConfig, Trainer
from blockir.diagnostics import BlockError, Span, error
from blockir.ir.printer import format_program
from blockir.ir.program import Program

FILES = ("program.block", "model.pt", "optimizer.pt", "counters.pt")
# what a resumed run takes from its checkpoint: a change to any of these is a different run
FROZEN = ("seed", "lr", "warmup", "batch", "dims", "backend")


def _bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def program_digest(program: Program) -> str:
    return sha256(format_program(program).encode())


def save(trainer: Trainer, directory: str | Path, source: str) -> dict[str, Any]:
    """Write the trainer's state to ``directory`` (created); returns the ``run.json`` record."""
    state = trainer.state_dict()
    cfg = {k: v for k, v in asdict(trainer.cfg).items() if k in FROZEN}
    return write(directory, trainer.program, trainer.block.name, source, cfg,
                 {"data": trainer.corpus.source, "data_sha256": trainer.corpus.digest}, state)


def write(directory: str | Path, program: Program, block: str, source: str, config: dict[str, Any],
          data: dict[str, str], state: dict[str, Any], extra: dict[str, bytes] | None = None) -> dict[str, Any]:
    """A checkpoint of ``state`` (model, optimizer, schedule, step, rng) for ``block`` of ``program``.

    ``extra`` files (a conversion report) are written beside it and hashed in ``run.json`` too.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    payloads = {"program.block": format_program(program).encode(),
                "model.pt": _bytes(state["model"]), "optimizer.pt": _bytes(state["optimizer"]),
                "counters.pt": _bytes({"schedule": state["schedule"], "step": state["step"], "rng": state["rng"]})}
    payloads |= extra or {}
    for name, payload in payloads.items():
        (out / name).write_bytes(payload)
    record = {"file": source, "block": block, "program_sha256": program_digest(program), "config": config,
              **data, "step": int(state["step"]), "sha256": {name: sha256(p) for name, p in payloads.items()}}
    (out / "run.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def read_state(directory: str | Path) -> dict[str, Any]:
    """The model, optimizer, schedule, step and rng of a checkpoint whose hashes were checked."""
    path = Path(directory)
    counters = torch.load(path / "counters.pt", weights_only=True)
    return {"model": torch.load(path / "model.pt", weights_only=True),
            "optimizer": torch.load(path / "optimizer.pt", weights_only=True), **counters}


def _refuse(directory: Path, message: str, hint: str | None = None) -> BlockError:
    return BlockError([error("E0725", message, Span(str(directory / "run.json"), 1, 1), hint=hint)])


def read_record(directory: str | Path) -> dict[str, Any]:
    path = Path(directory)
    try:
        record = json.loads((path / "run.json").read_text())
    except (OSError, ValueError) as exc:
        raise _refuse(path, f"not a blockir checkpoint: {exc}") from None
    for name in FILES:
        try:
            data = (path / name).read_bytes()
        except OSError as exc:
            raise _refuse(path, f"checkpoint file {name} is unreadable: {exc.strerror or exc}") from None
        if sha256(data) != record.get("sha256", {}).get(name):
            raise _refuse(path, f"checkpoint file {name} does not match the sha256 recorded in run.json")
    return record


def check_program(directory: str | Path, program: Program, block: str) -> dict[str, Any]:
    """The checkpoint's record, after checking it was trained on ``block`` of ``program``."""
    path = Path(directory)
    record = read_record(path)
    if record["block"] != block or record["program_sha256"] != program_digest(program):
        raise _refuse(path, f"the checkpoint was trained on {record['block']} of {record['file']}, a different "
                      f"program from {block} of {program.filename}", "name the file the checkpoint was saved from")
    return record


def resumed_config(directory: str | Path, cfg: RunConfig) -> RunConfig:
    """``cfg`` with the frozen fields taken from the checkpoint."""
    record = read_record(directory)
    return replace(cfg, **record["config"])


def load(trainer: Trainer, directory: str | Path) -> None:
    """Restore the state in ``directory`` into ``trainer``, after checking it continues the same run."""
    path = Path(directory)
    record = read_record(path)
    if record["block"] != trainer.block.name or record["program_sha256"] != program_digest(trainer.program):
        raise _refuse(path, f"the checkpoint was trained on {record['block']} of {record['file']}, a different "
                      f"program from {trainer.block.name} of this run", "resume with the file it was saved from")
    if record["data_sha256"] != trainer.corpus.digest:
        raise _refuse(path, f"the checkpoint was trained on {record['data']} (different bytes from "
                      f"{trainer.corpus.source})", "resume with the same --data")
    frozen = {k: v for k, v in asdict(trainer.cfg).items() if k in FROZEN}
    if frozen != record["config"]:
        changed = sorted(k for k in FROZEN if frozen.get(k) != record["config"].get(k))
        raise _refuse(path, f"the run's {', '.join(changed)} differ from the checkpoint's")
    trainer.load_state_dict(read_state(path))
