"""Where a command may write: checked before any work, so nothing a user did not ask to lose is lost.

A destination that does not exist, or an empty directory, is written. Anything else is replaced
only when it is a blockir artifact of the kind the command writes (a checkpoint for ``run --save``,
``calibrate --save`` and ``migrate --out``; a release for ``release --out`` and a serving slot),
identified by its files, and only when the command is told (``--force``) or the destination is
the one it continues (``run --resume DIR --save DIR``; a slot the canary fills). A file, a
symlink, a folder holding anything blockir did not write, or an artifact of another kind is never
replaced, and neither is a destination that equals, contains or lies inside one of the command's
inputs, ``--force`` or not.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import yaml

from blockir.lifecycle.artifact_files import CHECKPOINT_NAMES, MANIFEST, MAX_RECORD_BYTES, RELEASE_NAMES, RUN, where
from blockir.lifecycle.release_manifest import LOADER
from blockir.diagnostics import BlockError, error

CHECKPOINT, RELEASE = "checkpoint", "release"


def _record(path: Path, loader: object) -> object:
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_RECORD_BYTES:
            return None
        text = path.read_text(encoding="utf-8")
        return json.loads(text) if loader == "json" else yaml.load(text, Loader=LOADER)
    except (OSError, ValueError, yaml.YAMLError, RecursionError):
        return None


def identify(path: str | Path) -> str:
    """What ``path`` holds: missing, empty, checkpoint, release, file (not a directory) or foreign."""
    p = Path(path)
    if not os.path.lexists(p):
        return "missing"
    if p.is_symlink() or not p.is_dir():
        return "file"
    try:
        names = {e.name for e in os.scandir(p)}
    except OSError:
        return "foreign"
    if not names:
        return "empty"
    if MANIFEST in names and names <= set(RELEASE_NAMES):
        manifest = _record(p / MANIFEST, "yaml")
        if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) and "format" in manifest:
            return RELEASE
    if RUN in names and names <= set(CHECKPOINT_NAMES):
        record = _record(p / RUN, "json")
        if isinstance(record, dict) and isinstance(record.get("sha256"), dict) and "block" in record:
            return CHECKPOINT
    return "foreign"


def _refuse(code: str, message: str, path: Path, hint: str | None) -> BlockError:
    return BlockError([error(code, message, where(path), hint=hint)])


def _overlap(dest: Path, inputs: Sequence[tuple[str, str | Path]], same: Path | None) -> tuple[str, Path] | None:
    d = dest.resolve()
    for option, path in inputs:
        p = Path(path).resolve()
        if (d == p and (same is None or p != same.resolve())) or d in p.parents or p in d.parents:
            return option, Path(path)
    return None


def check(dest: str | Path, option: str, writes: str, force: bool,
          inputs: Sequence[tuple[str, str | Path | None]] = (), same: str | Path | None = None,
          code: str = "E0731") -> None:
    """Refuse ``dest`` (given as ``option``) unless writing ``writes`` there loses nothing the user did not give up.

    ``inputs`` are (option, path or None) of everything the command reads; ``same`` is the one artifact
    the command may replace untold (the checkpoint it resumes); ``code`` is the refusal of an artifact
    of the right kind that the command was not told to replace.
    """
    path = Path(dest)
    same_path = Path(same) if same is not None else None
    hit = _overlap(path, [(o, p) for o, p in inputs if p is not None], same_path)
    if hit is not None:
        how = "is" if path.resolve() == hit[1].resolve() else \
            "contains" if path.resolve() in hit[1].resolve().parents else "lies inside"
        raise _refuse("E0732", f"{option} {path} {how} {hit[0]} {hit[1]}, which this command reads; it is never "
                      "written over, --force or not", path, f"give {option} a directory of its own")
    kind = identify(path)
    if kind in ("missing", "empty"):
        return
    if kind == "file":
        raise _refuse("E0731", f"{option} {path} is a file or a link, not a {writes} directory; it is never "
                      "replaced", path, f"give {option} a new directory")
    if kind == "foreign":
        raise _refuse("E0731", f"{option} {path} holds files blockir did not write; it is never replaced or "
                      "deleted, --force or not", path, f"give {option} a new or empty directory")
    if kind != writes:
        raise _refuse("E0731", f"{option} {path} holds a blockir {kind}; a {writes} is never written over one",
                      path, f"give {option} a new directory")
    if force or (same_path is not None and path.resolve() == same_path.resolve()):
        return
    raise _refuse(code, f"{option} {path} already holds a blockir {kind}; it is not replaced unless told",
                  path, f"pass --force to replace it whole (the old {kind} stays intact until the new one is "
                  "complete), or give a new directory")


def describe(path: str | Path | None, option: str) -> str:
    """What ``path`` holds now, said after an interrupted command: the user learns what was kept."""
    if path is None:
        return f"nothing was written (no {option})"
    kind = identify(path)
    if kind == CHECKPOINT:
        record = _record(Path(path) / RUN, "json")
        step = record.get("step") if isinstance(record, dict) else None
        return f"{path} holds a complete checkpoint (step {step}); no partial files were left"
    if kind == RELEASE:
        return f"{path} holds a complete release; no partial files were left"
    if kind == "missing":
        return f"nothing was written: {path} does not exist"
    return f"{path} was not written"
