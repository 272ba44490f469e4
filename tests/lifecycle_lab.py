"""Tiny lifecycle artifacts for the safety, signal and fuzz tests: a one-layer model, its checkpoints and releases.

Everything is built through the command line in-process, at sizes where a run takes a fraction
of a second, and snapshots compare whole folders byte for byte.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import yaml

from blockir.cli import main

ROOT_ENV = {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)}  # child processes import this tree
TINY = """\
dim B: batch
dim S: seq
dim D: model = 8
dim F: hidden = 16

block Layer(x: [B, S, D]) -> [B, S, D] {
  ln_1: layernorm(D)
  attn: self_attention(heads=2, causal=true)
  ln_2: layernorm(D)
  mlp: mlp(F, act=gelu)
  h = x + attn(ln_1(x))
  y = h + mlp(ln_2(h))
  return y
}

model Tiny(x: [B, S, D]) -> [B, S, D] {
  layers: Layer * 1
  norm: layernorm(D)
  return norm(layers(x))
}
"""
DIMS = ["--dims", "B=2,S=8"]
FAST = ["--max-latency-ratio", "1000"]  # timing noise on a shared CPU is not what these tests check


def cli(*argv: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def ok(*argv: str | Path) -> str:
    code, out, err = cli(*argv)
    assert code == 0, err
    return out


def build(lab: Path) -> Path:
    """``lab`` with tiny.block, data.txt, ck (1 step), ck2 (2 steps), r1, r2 (--previous r1) and a key map."""
    (lab / "tiny.block").write_text(TINY)
    (lab / "renamed.block").write_text(TINY.replace("ln_1", "pre_norm"))
    (lab / "map.yaml").write_text("rename:\n  layers.{i}.ln_1.weight: layers.{i}.pre_norm.weight\n"
                                  "  layers.{i}.ln_1.bias: layers.{i}.pre_norm.bias\n")
    (lab / "data.txt").write_bytes(b"the quick brown fox jumps over the lazy dog; " * 100)
    run = ["run", lab / "tiny.block", *DIMS, "--data", lab / "data.txt"]
    ok(*run, "--steps", "1", "--save", lab / "ck")
    ok(*run, "--steps", "1", "--resume", lab / "ck", "--save", lab / "ck2")
    ok("release", lab / "ck", "--out", lab / "r1", *FAST)
    ok("release", lab / "ck2", "--out", lab / "r2", "--previous", lab / "r1", *FAST)
    return lab


def snapshot(*roots: Path) -> dict[str, bytes | str]:
    """Every entry under ``roots``: file bytes, link targets, directory markers, and modes."""
    out: dict[str, bytes | str] = {}
    for root in roots:
        if not os.path.lexists(root):
            out[str(root)] = "missing"
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            out[dirpath] = f"dir {oct(os.lstat(dirpath).st_mode)}"
            for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
                p = os.path.join(dirpath, name)
                if os.path.islink(p):
                    out[p] = "link " + os.readlink(p)
                else:
                    out[p] = Path(p).read_bytes() + oct(os.lstat(p).st_mode).encode()
    return out


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    for p in [dst, *dst.rglob("*")]:
        if not p.is_symlink():
            p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rewrite(folder: Path, name: str, data: bytes) -> None:
    """Replace ``name`` and update every hash that states it (run.json; release.yaml's files and state)."""
    (folder / name).write_bytes(data)
    if name not in ("run.json", "release.yaml"):
        record = json.loads((folder / "run.json").read_text())
        record["sha256"][name] = sha(data)
        (folder / "run.json").write_text(json.dumps(record, indent=2))
    manifest_path = folder / "release.yaml"
    if manifest_path.exists() and name != "release.yaml":
        manifest = yaml.load(manifest_path.read_text(), Loader=yaml.CSafeLoader)
        for n in manifest["files"]:
            if (folder / n).is_file():
                manifest["files"][n] = sha((folder / n).read_bytes())
        keys = {"model.pt": "checkpoint_hash", "optimizer.pt": "optimizer_hash",
                "counters.pt": "rng_and_schedule_counters_hash", "program.block": "program_hash"}
        if name in keys:
            manifest["state"][keys[name]] = sha(data)
        manifest_path.write_text(yaml.dump(manifest, Dumper=yaml.CSafeDumper, sort_keys=False))


def leftovers(parent: Path) -> list[str]:
    """Staging or set-aside siblings of the atomic writer left in ``parent``."""
    return sorted(p.name for p in parent.iterdir() if ".blockir-new-" in p.name or ".blockir-old-" in p.name)
