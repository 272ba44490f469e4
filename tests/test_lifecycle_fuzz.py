"""Structured fuzzing of what the lifecycle commands read: run folders, key maps, release manifests and slots.

Each case copies a valid artifact, mutates it (truncated or flipped bytes, deleted, renamed or extra
files, symlinks, JSON and YAML fields set to wrong types and values or to names that walk out of the
folder, state files replaced by other structures with every hash updated so the deeper checks are
reached), runs a command that reads it through the CLI in-process, and asserts that it ends in a result
or a located diagnostic, never an exception, and that every folder it was not told to write is byte for
byte what it was. ``BLOCKIR_FUZZ_LIFECYCLE=N`` runs N cases instead of the default.
"""
from __future__ import annotations

import io
import json
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from blockir.lifecycle import checkpoint
from blockir.lifecycle.release import read_artifact
from lifecycle_lab import DIMS, FAST, build, cli, copy, rewrite, snapshot

CASES = int(os.environ.get("BLOCKIR_FUZZ_LIFECYCLE", "200"))
LOCATED = re.compile(r"^\S.*: error\[E\d{4}\]: \S", re.M)
WRONG = [None, True, -1, 0, 2 ** 70, 1.5, float("nan"), float("inf"), "", "x", "../../escape", "/etc/passwd",
         [], [1, "a"], {}, {"a": 1}, "0" * 64]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("fuzz"))


def _torch(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _edit(doc: Any, rng: random.Random) -> Any:
    """``doc`` with one field deleted, retyped, renamed to a traversal name, or a field added."""
    paths = _paths(doc)
    if not paths:
        return rng.choice(WRONG)
    path = rng.choice(paths)
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    action = rng.randrange(4)
    if action == 0 and isinstance(parent, dict):
        del parent[path[-1]]
    elif action == 1 and isinstance(parent, dict):
        parent[rng.choice(["../x", "/abs", "a/b", "..", "extra"])] = parent.pop(path[-1])
    elif action == 2 and isinstance(parent, dict):
        parent[rng.choice(["zzz", "model.pt", "../model.pt"])] = rng.choice(WRONG)
    else:
        parent[path[-1]] = rng.choice(WRONG)
    return doc


def _state_like(rng: random.Random, original: Any) -> Any:
    """Another structure where a state file's belongs: bare tensors, wrong shapes, missing or extra entries."""
    choice = rng.randrange(6)
    if choice == 0:
        return torch.zeros(rng.randrange(1, 5))
    if choice == 1:
        return [1, 2, 3]
    if isinstance(original, dict) and original:
        state = dict(original)
        key = rng.choice(list(state))
        if choice == 2:
            del state[key]
        elif choice == 3:
            state[key] = torch.zeros(3, 3) if rng.random() < 0.5 else "text"
        elif choice == 4:
            state["extra"] = torch.ones(1)
        else:
            inner = state[key]
            state[key] = _edit(inner, rng) if isinstance(inner, (dict, list)) else None
        return state
    return {"x": torch.zeros(1)}


def _mutate_folder(folder: Path, rng: random.Random, outside: Path) -> str:
    files = sorted(p for p in folder.iterdir() if p.is_file())
    target = rng.choice(files)
    action = rng.randrange(10)
    data = target.read_bytes()
    if action == 0:
        target.write_bytes(data[:rng.randrange(len(data) + 1)])
    elif action == 1 and data:
        i = rng.randrange(len(data))
        target.write_bytes(data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:])
    elif action == 2:
        target.unlink()
    elif action == 3:
        target.rename(folder / rng.choice(["model.pt", "run.json", "renamed", "..x", "release.yaml"]))
    elif action == 4:
        (folder / rng.choice(["notes.txt", "conversion.yaml", "extra.pt"])).write_bytes(b"planted")
    elif action == 5:
        target.unlink()
        target.symlink_to(rng.choice([outside, folder / rng.choice([f.name for f in files])]))
    elif action in (6, 7) and target.suffix in (".json", ".yaml"):
        doc = json.loads(data) if target.suffix == ".json" else yaml.load(data, Loader=yaml.CSafeLoader)
        doc = _edit(doc, rng)
        text = json.dumps(doc) if target.suffix == ".json" else yaml.dump(doc, Dumper=yaml.CSafeDumper)
        target.write_text(text)
        if action == 7 and target.name == "run.json" and (folder / "release.yaml").exists():
            rewrite(folder, "run.json", target.read_bytes())  # the manifest agrees, so the record's checks run
    elif target.suffix == ".pt":
        original = torch.load(target, weights_only=True)
        rewrite(folder, target.name, _torch(_state_like(rng, original)))
    else:
        rewrite(folder, target.name, data + b"\n# appended\n")
    return f"{action} on {target.name}"


def _key_map(rng: random.Random) -> str:
    sections = ["rename", "transpose", "reshape", "drop", "move", "rename"]
    pieces = ["layers", "{i}", "{j}", "{i}", "ln_1", "weight", "bias", "{", "}", "{}", "{0}", "pre_norm", "a{b"]

    def key() -> str:
        return ".".join(rng.choice(pieces) for _ in range(rng.randrange(1, 5)))
    doc: dict[str, Any] = {}
    for _ in range(rng.randrange(1, 4)):
        section = rng.choice(sections)
        if rng.random() < 0.5:
            doc[section] = {key(): key() if rng.random() < 0.8 else rng.choice(WRONG) for _ in range(rng.randrange(3))}
        else:
            doc[section] = [key() if rng.random() < 0.8 else rng.choice(WRONG) for _ in range(rng.randrange(3))]
    text = yaml.dump(doc, Dumper=yaml.CSafeDumper) if rng.random() < 0.8 else rng.choice(
        ["rename: {a: [\n", "[" * 3000, "- 1\n- 2\n", "rename:\n  a: b\nrename:\n  c: d\n", "\x00\x01"])
    if rng.random() < 0.2:
        text = text[:rng.randrange(len(text) + 1)]
    return text


def _case(lab: Path, work: Path, rng: random.Random) -> tuple[list[Any], list[Path], str]:
    """The command, the folders it may write, and what was done."""
    kind = rng.choices(["run", "release", "map", "slot"], [40, 20, 28, 12])[0]
    outside = work / "outside.bin"
    outside.write_bytes(b"outside the artifact")
    if kind == "map":
        (work / "m.yaml").write_text(_key_map(rng))
        return (["migrate", lab / "tiny.block", lab / "renamed.block", "--checkpoint", lab / "ck", "--map",
                 work / "m.yaml"], [], "key map")
    if kind == "run":
        ck = copy(lab / "ck", work / "ck")
        what = _mutate_folder(ck, rng, outside)
        reader = rng.randrange(4)
        if reader == 0:
            return ["run", lab / "tiny.block", *DIMS, "--data", lab / "data.txt", "--steps", "1", "--resume", ck], \
                [], what
        if reader == 1:
            return ["diverge", lab / "tiny.block", *DIMS, "--checkpoint-a", ck], [], what
        if reader == 2:
            return ["release", ck, "--out", work / "out", *FAST], [work / "out"], what
        return ["migrate", lab / "tiny.block", lab / "renamed.block", "--checkpoint", ck, "--map", lab / "map.yaml"], \
            [], what
    if kind == "release":
        rel = copy(lab / "r2", work / "rel")
        what = _mutate_folder(rel, rng, outside)
        return (["canary", lab / "r1", rel, "--data", lab / "data.txt", "--windows", "2", "--repeats", "1",
                 "--slot", work / "slot"], [work / "slot"], what)
    slot = copy(lab / rng.choice(["r1", "ck"]), work / "slot")
    what = _mutate_folder(slot, rng, outside)
    return (["canary", lab / "r1", lab / "r2", "--data", lab / "data.txt", "--windows", "2", "--repeats", "1",
             "--slot", slot], [slot], what)


@pytest.mark.parametrize("seed", range(CASES))
def test_every_mutated_artifact_ends_in_a_result_or_a_located_error(lab: Path, tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    argv, writes, what = _case(lab, tmp_path, rng)
    watched = [lab, *(p for p in tmp_path.iterdir() if p not in writes)]
    before, told = snapshot(*watched), snapshot(*writes)
    code, out, err = cli(*argv)
    assert code in (0, 1, 2), (what, err)
    assert "Traceback" not in err
    report = out.rstrip().endswith(("canary passed", "canary failed")) or "; promoted: " in out or \
        "; rolled back: " in out
    if code == 2:
        assert err.startswith("blockir: "), (what, err)
    elif code == 1 and not report:
        assert LOCATED.search(err), (what, err)
    assert snapshot(*watched) == before, what
    if code == 0 or report:  # a destination it was told to write now holds a whole artifact, every hash checked
        for dest in writes:
            (read_artifact if (dest / "release.yaml").exists() else checkpoint.read_record)(dest)
    else:
        assert snapshot(*writes) == told, what
