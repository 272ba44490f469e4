"""Release artifacts: an immutable directory holding a whole run state and its manifest; canary and rollback.

A release directory holds the checkpoint's files (graph, parameters, optimizer, counters, run
record, and a conversion report when the state was migrated) and ``release.yaml``: the
architecture fields, the runtime, every file's sha256, the evidence (conversion and conformance
reports) and the rollback pointer (the previous artifact's path and hash, and the canary's trigger
thresholds, fixed at release time). The artifact's hash is the sha256 of ``release.yaml``, which
names every other file by its hash. The directory appears whole (:mod:`blockir.lifecycle.atomic`),
its files read-only; reading it checks every hash the manifest states
(:mod:`blockir.lifecycle.release_manifest`) before anything is compared or copied.

The canary builds both artifacts' models and feeds them the same validation windows: logits,
validation loss, non-finite values, forward latency and parameter memory against the candidate's
declared thresholds. Rollback restores the previous artifact whole — graph, weights, optimizer,
counters, configuration — into a slot, after checking every hash; never a candidate's optimizer
or counters with the old graph.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from blockir.analyses.manifest import to_yaml
from blockir.lifecycle.release_architecture import architecture
from blockir.lifecycle.thresholds import DEFAULT_THRESHOLDS
from blockir.api import parse
from blockir.lifecycle import atomic, checkpoint, state_check
from blockir.lifecycle.artifact_files import CALIBRATION, CONVERSION, MANIFEST, MAX_RECORD_BYTES, RUN, file_in, where
from blockir.lifecycle.conformance import blocking, conformance_checks
from blockir.lifecycle.corpus import check_windows, fixed_starts, load_corpus, windows
from blockir.lifecycle.lm import ByteLM
from blockir.lifecycle.release_manifest import FORMAT, cross_check, parse_manifest
from blockir.lifecycle.session import RunConfig, build_model
from blockir.diagnostics import BlockError, Span, error
from blockir.ir.decls import KindDecl
from blockir.ir.program import Program
from blockir.norms import family


def artifact_error(message: str, path: str | Path, hint: str | None = None) -> BlockError:
    return BlockError([error("E0728", message, Span(str(path), 1, 1), hint=hint)])


@dataclass(frozen=True)
class Artifact:
    path: Path
    manifest: dict[str, Any]
    sha256: str
    program: Program
    record: dict[str, Any]
    files: dict[str, bytes]  # every file's bytes as checked, the manifest's included


def read_artifact(directory: str | Path) -> Artifact:
    """A release whose every file matches every hash its manifest and its run record state."""
    path = Path(directory)
    atomic.recover(path)
    if not path.is_dir():
        raise artifact_error(f"not a blockir release: {path} is not a directory", path / MANIFEST)
    raw = file_in(path, MANIFEST, where(path / MANIFEST), MAX_RECORD_BYTES)
    manifest = parse_manifest(raw, path / MANIFEST)
    files = {}
    for name, digest in manifest["files"].items():
        files[name] = file_in(path, name, where(path / MANIFEST, f"files.{name}"))
        if checkpoint.sha256(files[name]) != digest:
            raise artifact_error(f"release file {name} does not match the sha256 in {MANIFEST}: the artifact was "
                                 "modified after release", path / MANIFEST)
    record = checkpoint.read_record(path)
    cross_check(manifest, record, path / MANIFEST)
    program = parse(files["program.block"].decode("utf-8", "replace"), str(path / "program.block"))
    return Artifact(path, manifest, checkpoint.sha256(raw), program, record, {**files, MANIFEST: raw})


def _loaded(model: ByteLM, data: bytes, path: Path, block: str) -> ByteLM:
    """``model`` with the parameters in ``data`` (the bytes of ``path``), checked against it before loading."""
    state = state_check.tensors(state_check.load_bytes(data, str(path)), model.state_dict(), str(path), block)
    model.load_state_dict(state, strict=True)
    return model


def _model(art: Artifact) -> ByteLM:
    cfg = RunConfig(**art.record["config"])
    block = _block(art.program, art.record, art.path / RUN)
    model, _ = build_model(art.program, block, cfg)
    return _loaded(model, art.files["model.pt"], art.path / "model.pt", block.name).eval()


def _block(program: Program, record: dict[str, Any], where_: Path) -> Any:
    if record["block"] not in program.block_map:
        raise artifact_error(f"run.json names block {record['block']!r:.60}, which program.block does not define",
                             where_)
    return program.block(record["block"])


def _conformance(program: Program, ckpt: Path, record: dict[str, Any], files: dict[str, bytes]) -> dict[str, Any]:
    """The checks a release runs itself (``blockir.lifecycle.conformance``), each with its tolerance and measured
    error; a graph with errors, a non-finite forward or a failing check of the runtime backend refuses it."""
    from blockir.api import verify
    diags = verify(program)
    errors = [d for d in diags if d.is_error]
    if errors:
        raise artifact_error(f"the checkpoint's graph has {len(errors)} error(s): {errors[0].message}", ckpt / RUN)
    cfg = RunConfig(**record["config"])
    block = _block(program, record, ckpt / RUN)
    checks = conformance_checks(program, block, cfg,
                                lambda m: _loaded(m, files["model.pt"], ckpt / "model.pt", block.name), len(errors))
    failed = blocking(checks, cfg.backend)
    if failed is not None:
        raise artifact_error(f"conformance check {failed['check']} fails: {failed['what']}: measured "
                             f"{failed['measured_error']:g} > {failed['tolerance']:g}", ckpt / RUN)
    return {"checks": checks, "checkpoint_round_trip": "every file matches run.json; model.pt loads strictly"}


def running_statistics(program: Program) -> bool:
    """Whether a norm of the program keeps running moments, which a release's fold and evaluation depend on."""
    return any(isinstance(d, KindDecl) and d.category == "norm" and family(d).batch_coupled and d.arg("running", True)
               for b in program.blocks for d in b.decls)


def _calibration(program: Program, files: dict[str, bytes], ckpt: Path) -> dict[str, Any] | str:
    """What ``blockir calibrate --save`` recorded (its data's sha256 and its fold error), when the model keeps
    running statistics."""
    if CALIBRATION in files:
        try:
            report = json.loads(files[CALIBRATION].decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            report = None
        if not isinstance(report, dict):
            raise artifact_error(f"{CALIBRATION} is not a calibration record", ckpt / CALIBRATION,
                                 "calibrate the checkpoint again with blockir calibrate --save")
        return {"file": CALIBRATION, "sha256": checkpoint.sha256(files[CALIBRATION]), **report}
    if running_statistics(program):
        return "none: the running statistics were never calibrated (blockir calibrate --save)"
    return "not required (no running statistics)"


def release(ckpt: str | Path, out: str | Path, previous: str | Path | None,
            thresholds: dict[str, float]) -> tuple[dict[str, Any], str]:
    """Write the release of checkpoint ``ckpt`` to ``out`` (a destination already checked); its manifest and hash."""
    src, dst = Path(ckpt), Path(out)
    record, payloads = checkpoint.read(src)
    program = parse(payloads["program.block"].decode("utf-8", "replace"), str(src / "program.block"))
    prev = read_artifact(previous) if previous is not None else None
    conformance = _conformance(program, src, record, payloads)
    payloads[RUN] = file_in(src, RUN, where(src / RUN), MAX_RECORD_BYTES)
    files = {n: checkpoint.sha256(p) for n, p in payloads.items()}
    fields = architecture(program, record["block"])
    cfg = record["config"]
    manifest: dict[str, Any] = {
        "format": FORMAT,
        **{k: v for k, v in fields.items() if k != "manifest"},
        "runtime": {"backend": cfg["backend"], "eager_reference": "fx", "fused_abi": "named outputs (normalized, "
                    "residual)", "parallel_layout": "replicated (single device)", "dims": cfg["dims"],
                    "torch": str(torch.__version__)},
        "state": {"checkpoint_hash": files["model.pt"], "optimizer_hash": files["optimizer.pt"],
                  "rng_and_schedule_counters_hash": files["counters.pt"], "program_hash": files["program.block"],
                  "step": record["step"], "seed": cfg["seed"], "data": record["data"],
                  "data_sha256": record["data_sha256"]},
        "evidence": {"conversion_report": {"file": CONVERSION, "sha256": files[CONVERSION]} if CONVERSION in files
                     else "none: trained from the graph's declared initialisation",
                     "conformance_report": conformance,
                     "calibration_report": _calibration(program, payloads, src)},
        "rollback": {"previous_artifact": str(prev.path) if prev else None,
                     "previous_artifact_hash": prev.sha256 if prev else None,
                     "trigger_thresholds": thresholds},
        "files": files,
        "block_manifest": fields["manifest"],
    }
    text = to_yaml(manifest, report=True)
    atomic.publish(dst, {**payloads, MANIFEST: text.encode()}, read_only=True)
    return manifest, checkpoint.sha256(text.encode())


def restore(art: Artifact, slot: str | Path) -> None:
    """Put the whole artifact ``art`` into ``slot`` (a destination already checked): its files, byte for byte.

    The slot holds one artifact or the other, never a mixture, and never neither.
    """
    atomic.publish(slot, art.files)


@dataclass(frozen=True)
class Measures:
    logits: torch.Tensor
    loss: float
    non_finite: int
    latency_s: float
    parameter_bytes: int


def _measure(model: ByteLM, batches: list[torch.Tensor], repeats: int) -> Measures:
    with torch.no_grad():
        outs, losses = [], []
        for b in batches:
            logits, target = model.logits(b)
            outs.append(logits)
            losses.append(float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                                  target.reshape(-1))))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.logits(batches[0])
            times.append(time.perf_counter() - t0)
    logits = torch.cat(outs)
    return Measures(logits, sum(losses) / len(losses), int((~torch.isfinite(logits)).sum()),
                    statistics.median(times), sum(p.numel() * p.element_size() for p in model.parameters()))


def canary(old: Artifact, new: Artifact, data: str | None, windows_n: int, repeats: int,
           overrides: dict[str, float]) -> dict[str, Any]:
    """Both artifacts on the same validation windows against the candidate's declared thresholds."""
    if new.manifest["rollback"]["previous_artifact_hash"] != old.sha256:
        raise artifact_error(f"{new.path} does not name {old.path} as its previous artifact (its rollback pointer "
                             f"is {new.manifest['rollback']['previous_artifact_hash']}); a canary compares a "
                             "candidate with the artifact it would roll back to", new.path / MANIFEST,
                             "release the candidate with --previous set to the artifact in service")
    thresholds = {**DEFAULT_THRESHOLDS, **new.manifest["rollback"]["trigger_thresholds"], **overrides}
    a, b = _model(old), _model(new)
    if a.shape.window != b.shape.window:
        raise artifact_error("the two artifacts read windows of different lengths; a canary feeds both the same "
                             "bytes", new.path / MANIFEST)
    corpus = load_corpus(data, "canary")
    check_windows(corpus, a.shape.window, "canary")
    rows = windows(corpus.val, fixed_starts(corpus.val, windows_n, a.shape.window), a.shape.window)
    batches = list(rows.split(max(1, windows_n // 2)))
    torch.manual_seed(0)
    ma, mb = _measure(a, batches, repeats), _measure(b, batches, repeats)
    same_shape = ma.logits.shape == mb.logits.shape
    error_max = float((mb.logits - ma.logits).abs().max()) if same_shape else float("inf")
    checks = [
        ("logit_error", error_max, thresholds["max_logit_error"], "max |new - old| of the logits"),
        ("loss_increase", mb.loss - ma.loss, thresholds["max_loss_increase"], "validation loss, new - old (nats)"),
        ("latency_ratio", mb.latency_s / max(ma.latency_s, 1e-9), thresholds["max_latency_ratio"],
         "median forward time, new / old"),
        ("memory_ratio", mb.parameter_bytes / max(ma.parameter_bytes, 1), thresholds["max_memory_ratio"],
         "parameter bytes, new / old"),
        ("non_finite", float(mb.non_finite), thresholds["max_non_finite"], "non-finite logits of the candidate"),
    ]
    results = [{"check": name, "value": value, "threshold": limit, "breached": not value <= limit, "what": what}
               for name, value, limit, what in checks]
    return {"old": {"path": str(old.path), "sha256": old.sha256, "validation_loss": ma.loss,
                    "latency_s": ma.latency_s, "parameter_bytes": ma.parameter_bytes},
            "new": {"path": str(new.path), "sha256": new.sha256, "validation_loss": mb.loss,
                    "latency_s": mb.latency_s, "parameter_bytes": mb.parameter_bytes, "non_finite": mb.non_finite},
            "inputs": f"{rows.shape[0]} validation windows of {a.shape.window} bytes from {corpus.source}",
            "checks": results, "passed": not any(r["breached"] for r in results)}
