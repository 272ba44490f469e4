"""``release.yaml`` read as a schema, and every hash it states checked against the bytes it names.

A manifest states each file's sha256 twice over: in ``files`` and, for the state, in
``state`` (``checkpoint_hash`` for ``model.pt``, ``optimizer_hash``, the counters' and the
program's), and ``run.json`` records them a third time. A reader that trusted only the editable
``files`` table would accept a swapped ``model.pt`` whose table was edited to match; so every
statement is checked, and the fields a canary and a rollback read are checked for presence and
type first (``E0736``, at ``DIR/release.yaml: field.path``).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from blockir.lifecycle.thresholds import DEFAULT_THRESHOLDS
from blockir.lifecycle.artifact_files import (CALIBRATION, CHECKPOINT_NAMES, CONVERSION, RUN, STATE_FILES, plain_name,
                                             where)
from blockir.diagnostics import BlockError, error

FORMAT = 1
# libyaml's loader where PyYAML was built with it: a manifest is read on every canary and rollback
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
STATE_HASHES = {"checkpoint_hash": "model.pt", "optimizer_hash": "optimizer.pt",
                "rng_and_schedule_counters_hash": "counters.pt", "program_hash": "program.block"}


def manifest_error(path: Path, field: str | None, message: str, code: str = "E0736") -> BlockError:
    return BlockError([error(code, message, where(path, field),
                             hint="a release is written by blockir release and never edited; release the "
                                  "checkpoint again")])


def _table(value: Any, path: Path, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise manifest_error(path, field, f"is {type(value).__name__}, not a table")
    return value


def threshold(value: Any) -> bool:
    """A trigger threshold: a number, not NaN (a NaN limit would breach every check), not negative."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value) and value >= 0


def parse_manifest(raw: bytes, path: Path) -> dict[str, Any]:
    """The manifest in ``raw`` with the fields every reader uses present and of their types."""
    try:
        manifest = yaml.load(raw.decode("utf-8"), Loader=LOADER)
    except (UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise manifest_error(path, None, f"not a blockir release manifest: {str(exc)[:200]}", "E0728") from None
    manifest = _table(manifest, path, "") if manifest is not None else None
    if manifest is None:
        raise manifest_error(path, None, "the release manifest is empty", "E0728")
    if manifest.get("format") != FORMAT:
        raise manifest_error(path, "format", f"is {manifest.get('format')!r:.40}; this blockir reads format {FORMAT}")
    files = _table(manifest.get("files"), path, "files")
    if not files:
        raise manifest_error(path, "files", "the release manifest lists no files", "E0728")
    for name, digest in files.items():
        plain_name(name, CHECKPOINT_NAMES, where(path, f"files.{name}"))
        if not isinstance(digest, str) or len(digest) != 64:
            raise manifest_error(path, f"files.{name}", f"is {digest!r:.70}, not a sha256")
    for name in (*STATE_FILES, RUN):
        if name not in files:
            raise manifest_error(path, "files", f"lists no {name}; a release holds the whole run state")
    state = _table(manifest.get("state"), path, "state")
    for key in (*STATE_HASHES, "step", "data_sha256"):
        if key not in state:
            raise manifest_error(path, f"state.{key}", "is missing")
    rollback = _table(manifest.get("rollback"), path, "rollback")
    for key in ("previous_artifact", "previous_artifact_hash", "trigger_thresholds"):
        if key not in rollback:
            raise manifest_error(path, f"rollback.{key}", "is missing")
    pointer = rollback["previous_artifact_hash"]
    if pointer is not None and not isinstance(pointer, str):
        raise manifest_error(path, "rollback.previous_artifact_hash", f"is {pointer!r:.60}, not a sha256 or null")
    for key, value in _table(rollback["trigger_thresholds"], path, "rollback.trigger_thresholds").items():
        if key not in DEFAULT_THRESHOLDS:
            raise manifest_error(path, f"rollback.trigger_thresholds.{key}",
                                 f"is not a trigger (triggers: {', '.join(DEFAULT_THRESHOLDS)})")
        if not threshold(value):
            raise manifest_error(path, f"rollback.trigger_thresholds.{key}", f"is {value!r:.40}, not a number >= 0")
    return manifest


def cross_check(manifest: dict[str, Any], record: dict[str, Any], path: Path) -> None:
    """Every hash and count the manifest states agrees with its ``files`` table and with ``run.json``."""
    files = manifest["files"]
    for key, name in STATE_HASHES.items():
        if manifest["state"][key] != files[name]:
            raise manifest_error(path, f"state.{key}", f"does not match the sha256 of {name}: the artifact was "
                                 "modified after release", "E0728")
    evidence = manifest.get("evidence")
    for field, name in (("conversion_report", CONVERSION), ("calibration_report", CALIBRATION)):
        report = evidence.get(field) if isinstance(evidence, dict) else None
        if isinstance(report, dict) and (report.get("file") != name or report.get("sha256") != files.get(name)):
            raise manifest_error(path, f"evidence.{field}", f"does not match the sha256 of {name}", "E0728")
    recorded = record["sha256"]
    listed = {n: d for n, d in files.items() if n != RUN}
    if recorded != listed:
        name = sorted(set(recorded.items()) ^ set(listed.items()))[0][0]
        raise manifest_error(path, f"files.{name}", f"does not agree with the sha256 run.json records for {name}",
                             "E0728")
    for key, value in (("step", record["step"]), ("data_sha256", record["data_sha256"])):
        if manifest["state"][key] != value:
            raise manifest_error(path, f"state.{key}", f"is {manifest['state'][key]!r:.70}; run.json records "
                                 f"{value!r:.70}", "E0728")
