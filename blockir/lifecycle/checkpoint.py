"""Run checkpoints: everything that decides the next step, in files a release manifest can hash.

A checkpoint directory holds

- ``program.block`` — the program as printed (the graph; it parses back to the same IR),
- ``model.pt`` — the parameters (embedding, block, final norm, head),
- ``optimizer.pt`` — AdamW's moments and step counts,
- ``counters.pt`` — the schedule's counter, the step, torch's generator (dropout and
  stochastic-depth seeds) and the batch sampler's generator,
- ``run.json`` — the configuration, the corpus digest and the sha256 of every file above.

Resuming refuses a checkpoint whose program, sizes or data differ from the run that continues it:
the same bytes in must give the same bytes out. The directory is written whole or not at all
(:mod:`blockir.lifecycle.atomic`); reading it checks ``run.json`` as a schema, every file against
its sha256, and every state file against the objects it is loaded into before loading it.
"""
from __future__ import annotations

import hashlib
import io
import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from blockir.lifecycle import atomic, state_check
from blockir.lifecycle.artifact_files import MAX_RECORD_BYTES, RUN, STATE_FILES, file_in, where
from blockir.lifecycle.run_record import FROZEN, SETTINGS, parse_record
from blockir.lifecycle.session import RunConfig, Trainer
from blockir.diagnostics import BlockError, Span, error
from blockir.ir.printer import format_program
from blockir.ir.program import Program

FILES = STATE_FILES


def _bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def program_digest(program: Program) -> str:
    return sha256(format_program(program).encode())


def save(trainer: Trainer, directory: str | Path, source: str, extra: dict[str, bytes] | None = None) -> dict[str, Any]:
    """Write the trainer's state (and ``extra`` reports) to ``directory`` (whole, replacing it); returns the
    ``run.json`` record."""
    state = trainer.state_dict()
    cfg = {k: v for k, v in asdict(trainer.cfg).items() if k in FROZEN + SETTINGS}
    return write(directory, trainer.program, trainer.block.name, source, cfg,
                 {"data": trainer.corpus.source, "data_sha256": trainer.corpus.digest}, state, extra)


def write(directory: str | Path, program: Program, block: str, source: str, config: dict[str, Any],
          data: dict[str, str], state: dict[str, Any], extra: dict[str, bytes] | None = None) -> dict[str, Any]:
    """A checkpoint of ``state`` (model, optimizer, schedule, step, rng) for ``block`` of ``program``.

    ``extra`` files (a conversion report) are written beside it and hashed in ``run.json`` too. The
    destination was checked by the command (:mod:`blockir.lifecycle.destination`); the directory
    appears whole, with every file, or keeps what it held.
    """
    payloads = {"program.block": format_program(program).encode(),
                "model.pt": _bytes(state["model"]), "optimizer.pt": _bytes(state["optimizer"]),
                "counters.pt": _bytes({"schedule": state["schedule"], "step": state["step"], "rng": state["rng"]})}
    payloads |= extra or {}
    record = {"file": source, "block": block, "program_sha256": program_digest(program), "config": config,
              **data, "step": int(state["step"]), "sha256": {name: sha256(p) for name, p in payloads.items()}}
    atomic.publish(directory, {**payloads, RUN: (json.dumps(record, indent=2) + "\n").encode()})
    return record


def _refuse(directory: Path, message: str, hint: str | None = None) -> BlockError:
    return BlockError([error("E0725", message, Span(str(directory / RUN), 1, 1), hint=hint)])


def read(directory: str | Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The record and the bytes of every file it names, each checked against its recorded sha256."""
    path = Path(directory)
    atomic.recover(path)
    if not path.is_dir():
        raise _refuse(path, f"not a blockir checkpoint: {path} is not a directory",
                      "give a directory written by blockir run --save")
    record = parse_record(file_in(path, RUN, where(path / RUN), MAX_RECORD_BYTES), path / RUN)
    files = {}
    for name, digest in record["sha256"].items():
        files[name] = file_in(path, name, where(path / RUN, f"sha256.{name}"))
        if sha256(files[name]) != digest:
            raise _refuse(path, f"checkpoint file {name} does not match the sha256 recorded in run.json")
    return record, files


def read_record(directory: str | Path) -> dict[str, Any]:
    return read(directory)[0]


def read_state(directory: str | Path) -> dict[str, Any]:
    """The model, optimizer, schedule, step and rng of a checkpoint whose hashes were checked.

    Only their form is checked here; :func:`load` checks them against the trainer they go to.
    """
    path = Path(directory)
    record, files = read(path)
    model = state_check.load_bytes(files["model.pt"], str(path / "model.pt"))
    optimizer = state_check.load_bytes(files["optimizer.pt"], str(path / "optimizer.pt"))
    counters = state_check.load_bytes(files["counters.pt"], str(path / "counters.pt"))
    if not isinstance(counters, dict) or set(counters) != {"schedule", "step", "rng"}:
        raise state_check.state_error("is not a counters file (a table of 'schedule', 'step' and 'rng')",
                                      str(path / "counters.pt"))
    if counters["step"] != record["step"]:
        raise state_check.state_error(f"is at step {counters['step']!r:.40}; run.json records step {record['step']}",
                                      str(path / "counters.pt"), "step")
    return {"model": model, "optimizer": optimizer, **counters}


def check_program(directory: str | Path, program: Program, block: str) -> dict[str, Any]:
    """The checkpoint's record, after checking it was trained on ``block`` of ``program``."""
    path = Path(directory)
    record = read_record(path)
    if record["block"] != block or record["program_sha256"] != program_digest(program):
        raise _refuse(path, f"the checkpoint was trained on {record['block']} of {record['file']}, a different "
                      f"program from {block} of {program.filename}", "name the file the checkpoint was saved from")
    return record


def resumed_config(directory: str | Path, cfg: RunConfig, carry: tuple[str, ...] = ()) -> RunConfig:
    """``cfg`` with the frozen fields, and the recorded ``carry`` settings, taken from the checkpoint; refused
    (E0849) where it steps otherwise than the checkpoint's run did."""
    record = read_record(directory)
    config = record["config"]
    resumed = replace(cfg, **{k: config[k] for k in (*FROZEN, *carry) if k in config})
    _same_stepping(Path(directory), config, resumed)
    return resumed


# --accum and --dtype decide what one optimizer step averages and the precision its gradients had
STEPPING = {"accum": "--accum", "dtype": "--dtype"}


def _same_stepping(path: Path, config: dict[str, Any], cfg: RunConfig) -> None:
    for key, option in STEPPING.items():
        if key in config and config[key] != getattr(cfg, key):
            raise BlockError([error("E0849", f"the checkpoint was trained with {option} {config[key]}; this run "
                                    f"asks for {option} {getattr(cfg, key)}", where(path / RUN, f"config.{key}"),
                                    hint=f"resume with {option} {config[key]}, or start a new run (without "
                                         f"--resume) to train with another")])


def restore(trainer: Trainer, directory: str | Path) -> None:
    """Load the checkpoint's state into ``trainer``, every file checked against what receives it first."""
    path = Path(directory)
    state = read_state(path)
    state_check.tensors(state["model"], trainer.model.state_dict(), str(path / "model.pt"), trainer.block.name)
    state_check.optimizer(state["optimizer"], trainer.optimizer, list(trainer.model.parameters()),
                          str(path / "optimizer.pt"))
    state_check.counters(state, trainer.schedule.state_dict(), str(path / "counters.pt"))
    trainer.load_state_dict(state)


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
    if frozen != {k: record["config"][k] for k in FROZEN}:
        changed = sorted(k for k in FROZEN if frozen.get(k) != record["config"].get(k))
        raise _refuse(path, f"the run's {', '.join(changed)} differ from the checkpoint's")
    _same_stepping(path, record["config"], trainer.cfg)
    restore(trainer, path)
