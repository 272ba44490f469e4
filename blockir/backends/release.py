"""Release artifacts: an immutable directory holding a whole run state and its manifest; canary and rollback.

A release directory holds the checkpoint's files (graph, parameters, optimizer, counters, run
record, and a conversion report when the state was migrated) and ``release.yaml``: the
architecture fields, the runtime, every file's sha256, the evidence (conversion and conformance
reports) and the rollback pointer (the previous artifact's path and hash, and the canary's trigger
thresholds, fixed at release time). The artifact's hash is the sha256 of ``release.yaml``, which
names every other file by its hash. Files are written once and made read-only.

The canary builds both artifacts' models and feeds them the same validation windows: logits,
validation loss, non-finite values, forward latency and parameter memory against the candidate's
declared thresholds. Rollback restores the previous artifact whole — graph, weights, optimizer,
counters, configuration — into a slot, after checking every hash; never a candidate's optimizer
or counters with the old graph.
"""
from __future__ import annotations

import shutil
import stat
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from blockir.analyses.manifest import to_yaml
from blockir.analyses.release import architecture
from blockir.analyses.thresholds import DEFAULT_THRESHOLDS
from blockir.api import parse
from blockir.backends import checkpoint
from blockir.backends.corpus import fixed_starts, load_corpus, windows
from blockir.backends.lm import ByteLM
from blockir.backends.migrate import REPORT as CONVERSION
from blockir.backends.session import RunConfig, build_model
from blockir.diagnostics import BlockError, Span, error
from blockir.ir.program import Program

MANIFEST = "release.yaml"
RUN = "run.json"
FORMAT = 1


def artifact_error(message: str, path: str | Path, hint: str | None = None) -> BlockError:
    return BlockError([error("E0728", message, Span(str(path), 1, 1), hint=hint)])


def _files(ckpt: Path) -> list[str]:
    names = [*checkpoint.FILES, RUN]
    return names + ([CONVERSION] if (ckpt / CONVERSION).exists() else [])


@dataclass(frozen=True)
class Artifact:
    path: Path
    manifest: dict[str, Any]
    sha256: str
    program: Program
    record: dict[str, Any]


def read_artifact(directory: str | Path) -> Artifact:
    """A release whose every file matches the hash its manifest records."""
    path = Path(directory)
    try:
        raw = (path / MANIFEST).read_bytes()
        manifest = yaml.safe_load(raw)
    except (OSError, yaml.YAMLError) as exc:
        raise artifact_error(f"not a blockir release: {getattr(exc, 'strerror', None) or exc}", path / MANIFEST) \
            from None
    hashes = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(hashes, dict) or not hashes:
        raise artifact_error("the release manifest lists no files", path / MANIFEST)
    for name, digest in hashes.items():
        try:
            data = (path / name).read_bytes()
        except OSError as exc:
            raise artifact_error(f"release file {name} is unreadable: {exc.strerror or exc}", path / MANIFEST) \
                from None
        if checkpoint.sha256(data) != digest:
            raise artifact_error(f"release file {name} does not match the sha256 in {MANIFEST}: the artifact was "
                                 "modified after release", path / MANIFEST)
    record = checkpoint.read_record(path)
    program = parse((path / "program.block").read_text(), str(path / "program.block"))
    return Artifact(path, manifest, checkpoint.sha256(raw), program, record)


def _model(art: Artifact) -> ByteLM:
    cfg = RunConfig(**art.record["config"])
    model, _ = build_model(art.program, art.program.block(art.record["block"]), cfg)
    model.load_state_dict(torch.load(art.path / "model.pt", weights_only=True), strict=True)
    return model.eval()


def _conformance(program: Program, ckpt: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The gates a release runs itself: the graph verifies, the state loads strictly, a forward is finite."""
    from blockir.api import verify
    diags = verify(program)
    errors = [d for d in diags if d.is_error]
    if errors:
        raise artifact_error(f"the checkpoint's graph has {len(errors)} error(s): {errors[0].message}", ckpt / RUN)
    cfg = RunConfig(**record["config"])
    model, _ = build_model(program, program.block(record["block"]), cfg)
    missing, unexpected = model.load_state_dict(torch.load(ckpt / "model.pt", weights_only=True), strict=False)
    if missing or unexpected:
        raise artifact_error(f"model.pt does not load into {record['block']} (missing {sorted(missing)[:3]}, "
                             f"unexpected {sorted(unexpected)[:3]})", ckpt / RUN)
    window = torch.randint(0, 256, (2, model.shape.window), generator=torch.Generator().manual_seed(cfg.seed))
    with torch.no_grad():
        logits, _ = model.eval().logits(window)
    bad = int((~torch.isfinite(logits)).sum())
    if bad:
        raise artifact_error(f"a forward of the checkpoint gives {bad} non-finite logits", ckpt / RUN)
    return {"verifiers": f"{len(diags)} diagnostics, 0 errors",
            "checkpoint_round_trip": "every file matches run.json; model.pt loads strictly",
            "forward": f"{logits.numel()} logits on 2 random windows, all finite"}


def release(ckpt: str | Path, out: str | Path, previous: str | Path | None,
            thresholds: dict[str, float]) -> tuple[dict[str, Any], str]:
    """Write the release of checkpoint ``ckpt`` to ``out``; returns its manifest and hash."""
    src, dst = Path(ckpt), Path(out)
    record = checkpoint.read_record(src)
    if dst.exists():
        raise artifact_error(f"{dst} exists: a release is written once, never over another", dst,
                             "choose a new directory for the new release")
    program = parse((src / "program.block").read_text(), str(src / "program.block"))
    prev = read_artifact(previous) if previous is not None else None
    conformance = _conformance(program, src, record)
    names = _files(src)
    files = {n: checkpoint.sha256((src / n).read_bytes()) for n in names}
    if CONVERSION in names and record["sha256"].get(CONVERSION) != files[CONVERSION]:
        raise artifact_error(f"{CONVERSION} does not match the sha256 in run.json", src / RUN)
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
                     "conformance_report": conformance, "calibration_report": "not required (no running statistics)"},
        "rollback": {"previous_artifact": str(prev.path) if prev else None,
                     "previous_artifact_hash": prev.sha256 if prev else None,
                     "trigger_thresholds": thresholds},
        "files": files,
        "block_manifest": fields["manifest"],
    }
    text = to_yaml(manifest, report=True)
    dst.mkdir(parents=True)
    for n in names:
        shutil.copyfile(src / n, dst / n)
    (dst / MANIFEST).write_text(text)
    for n in [*names, MANIFEST]:  # immutable: read-only files
        (dst / n).chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    return manifest, checkpoint.sha256(text.encode())


def restore(art: Artifact, slot: str | Path) -> None:
    """Put the whole artifact ``art`` into ``slot`` (replacing what is there): its files, byte for byte."""
    target = Path(slot)
    staging = target.with_name(target.name + ".incoming")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    for name in [*art.manifest["files"], MANIFEST]:
        shutil.copyfile(art.path / name, staging / name)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)  # the slot holds one artifact or the other, never a mixture


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
