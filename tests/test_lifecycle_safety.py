"""What the lifecycle commands never do: overwrite or delete unasked, follow names out of a folder, trust a
record's shape or a manifest's editable table, crash on a bad file or option. Each test fails on a writer
or reader that skips the check."""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
import torch
import yaml

from lifecycle_lab import DIMS, FAST, build, cli, copy, leftovers, rewrite, snapshot


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("safety"))


def _run(lab: Path, *extra: str | Path) -> tuple[int, str, str]:
    return cli("run", lab / "tiny.block", *DIMS, "--data", lab / "data.txt", "--steps", "1", *extra)


def _torch(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


# --- destinations: refused before any work, replaced only when told ------------------------------------

def test_save_onto_another_runs_checkpoint_is_refused_before_training_and_force_replaces_it(lab: Path,
                                                                                           tmp_path: Path) -> None:
    other = copy(lab / "ck2", tmp_path / "other")
    before = snapshot(other)
    code, _, err = _run(lab, "--save", other)
    assert code == 1 and f"{other}: error[E0731]: --save {other} already holds a blockir checkpoint" in err
    assert "pass --force" in err and "step 1/1" not in err  # refused before the first step
    assert snapshot(other) == before
    code, _, err = _run(lab, "--save", other, "--force")
    assert code == 0 and json.loads((other / "run.json").read_text())["step"] == 1
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("what", ["release", "foreign", "file", "input"])
def test_save_never_replaces_what_is_not_its_own_kind_even_with_force(lab: Path, tmp_path: Path, what: str) -> None:
    if what == "release":
        dest = copy(lab / "r1", tmp_path / "dest")
    elif what == "foreign":
        dest = tmp_path / "dest"
        dest.mkdir()
        (dest / "notes.txt").write_text("mine")
        (dest / "run.json").write_text("{}")
    elif what == "file":
        dest = tmp_path / "dest"
        dest.write_text("a file")
    else:  # the folder holding the program being run
        (tmp_path / "tiny.block").write_text((lab / "tiny.block").read_text())
        dest = tmp_path
    before = snapshot(dest)
    program = tmp_path / "tiny.block" if what == "input" else lab / "tiny.block"
    code, _, err = cli("run", program, *DIMS, "--data", lab / "data.txt", "--steps", "1", "--save", dest, "--force")
    expected = {"release": "holds a blockir release; a checkpoint is never written over one",
                "foreign": "holds files blockir did not write; it is never replaced or deleted, --force or not",
                "file": "is a file or a link, not a checkpoint directory",
                "input": f"contains FILE {program}, which this command reads"}[what]
    assert code == 1 and expected in err and "Traceback" not in err
    assert snapshot(dest) == before


def test_resume_and_save_to_the_same_checkpoint_continues_it(lab: Path, tmp_path: Path) -> None:
    ck = copy(lab / "ck", tmp_path / "ck")
    code, _, err = _run(lab, "--resume", ck, "--save", ck)
    assert code == 0 and json.loads((ck / "run.json").read_text())["step"] == 2
    assert leftovers(tmp_path) == []


def test_migrate_release_calibrate_outputs_are_refused_onto_existing_artifacts(lab: Path, tmp_path: Path) -> None:
    taken = copy(lab / "ck2", tmp_path / "taken")
    before = snapshot(taken)
    code, _, err = cli("migrate", lab / "tiny.block", lab / "renamed.block", "--checkpoint", lab / "ck", "--map",
                       lab / "map.yaml", "--out", taken)
    assert code == 1 and "error[E0731]" in err and "--force" in err and snapshot(taken) == before
    code, _, err = cli("migrate", lab / "tiny.block", lab / "renamed.block", "--checkpoint", lab / "ck",
                       "--out", lab / "ck" / "inner", "--force")
    assert code == 1 and "error[E0732]: --out" in err and "lies inside --checkpoint" in err
    rel = copy(lab / "r1", tmp_path / "rel")
    before = snapshot(rel)
    code, _, err = cli("release", lab / "ck2", "--out", rel, *FAST)
    assert code == 1 and "error[E0728]" in err and "pass --force" in err and snapshot(rel) == before
    assert cli("release", lab / "ck2", "--out", rel, "--force", *FAST)[0] == 0
    assert yaml.safe_load((rel / "release.yaml").read_text())["state"]["step"] == 2
    code, _, err = cli("calibrate", lab / "tiny.block", *DIMS, "--save", taken)
    assert code == 1 and "error[E0731]" in err  # before calibration would refuse a model without batch norms


@pytest.mark.parametrize("slot", ["file", "old", "parent", "foreign", "checkpoint"])
def test_canary_slot_is_refused_at_anything_but_a_slot(lab: Path, tmp_path: Path, slot: str) -> None:
    old, new = copy(lab / "r1", tmp_path / "old"), copy(lab / "r2", tmp_path / "new")
    target = {"file": tmp_path / "f", "old": old, "parent": tmp_path, "foreign": tmp_path / "d",
              "checkpoint": copy(lab / "ck", tmp_path / "c")}[slot]
    if slot == "file":
        target.write_text("x")
    if slot == "foreign":
        target.mkdir()
        (target / "keep.txt").write_text("keep")
    before = snapshot(tmp_path)
    code, _, err = cli("canary", old, new, "--data", lab / "data.txt", "--slot", target)
    assert code == 1 and ("error[E0731]" in err or "error[E0732]" in err) and "Traceback" not in err
    assert snapshot(tmp_path) == before


# --- names read from artifacts stay in their folder -----------------------------------------------------

def test_a_release_manifest_naming_a_file_outside_is_refused_before_copying(lab: Path, tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"outside")
    rel = copy(lab / "r2", tmp_path / "rel")
    manifest = yaml.safe_load((rel / "release.yaml").read_text())
    manifest["files"]["../secret"] = "0" * 64
    (rel / "release.yaml").write_text(yaml.safe_dump(manifest))
    slot = tmp_path / "slot"
    code, _, err = cli("canary", lab / "r1", rel, "--data", lab / "data.txt", "--slot", slot)
    assert code == 1 and f"{rel / 'release.yaml'}: files.../secret: error[E0733]" in err
    assert not slot.exists()


def test_a_checkpoint_file_that_is_a_symlink_is_refused(lab: Path, tmp_path: Path) -> None:
    ck = copy(lab / "ck", tmp_path / "ck")
    (tmp_path / "elsewhere.pt").write_bytes((ck / "model.pt").read_bytes())
    (ck / "model.pt").unlink()
    (ck / "model.pt").symlink_to(tmp_path / "elsewhere.pt")
    code, _, err = _run(lab, "--resume", ck)
    assert code == 1 and "error[E0733]: model.pt in" in err and "is a symlink" in err


# --- the canary checks every hash a manifest states --------------------------------------------------------

def test_canary_refuses_a_swapped_model_whose_file_table_was_edited(lab: Path, tmp_path: Path) -> None:
    new = copy(lab / "r2", tmp_path / "new")
    state = torch.load(new / "model.pt", weights_only=True)
    state["head.weight"] *= 3
    data = _torch(state)
    (new / "model.pt").write_bytes(data)
    manifest = yaml.safe_load((new / "release.yaml").read_text())
    record = json.loads((new / "run.json").read_text())
    record["sha256"]["model.pt"] = hashlib.sha256(data).hexdigest()
    (new / "run.json").write_text(json.dumps(record))
    manifest["files"]["model.pt"] = record["sha256"]["model.pt"]
    manifest["files"]["run.json"] = hashlib.sha256((new / "run.json").read_bytes()).hexdigest()
    (new / "release.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    code, _, err = cli("canary", lab / "r1", new, "--data", lab / "data.txt")
    assert code == 1 and f"{new / 'release.yaml'}: state.checkpoint_hash: error[E0728]: does not match the sha256 " \
        "of model.pt" in err


@pytest.mark.parametrize("field", ["rollback", "rollback.trigger_thresholds", "state", "format"])
def test_canary_manifest_missing_fields_are_located(lab: Path, tmp_path: Path, field: str) -> None:
    new = copy(lab / "r2", tmp_path / "new")
    manifest = yaml.safe_load((new / "release.yaml").read_text())
    head, _, leaf = field.partition(".")
    del (manifest[head] if leaf else manifest)[leaf or head]
    (new / "release.yaml").write_text(yaml.safe_dump(manifest))
    code, _, err = cli("canary", lab / "r1", new, "--data", lab / "data.txt")
    assert code == 1 and f"{new / 'release.yaml'}: {field}: error[E0736]" in err


# --- run files of the wrong shape ---------------------------------------------------------------------------

@pytest.mark.parametrize("edit, where", [
    (lambda r: r.pop("config"), "config: error[E0734]: is missing"),
    (lambda r: r.update(extra=1), "extra: error[E0734]: is not a field"),
    (lambda r: r.update(step="2"), "step: error[E0734]: is \"2\", not a count"),
    (lambda r: r["config"].update(lr=float("nan")), "config.lr: error[E0734]: must be a finite positive"),
    (lambda r: r["sha256"].update({"../x": "0" * 64}), "sha256.../x: error[E0733]"),
    (lambda r: r.clear() or r.update(a=[1]), "file: error[E0734]: is missing"),
])
def test_run_json_is_read_as_a_schema(lab: Path, tmp_path: Path, edit, where: str) -> None:
    ck = copy(lab / "ck", tmp_path / "ck")
    record = json.loads((ck / "run.json").read_text())
    edit(record)
    (ck / "run.json").write_text(json.dumps(record))
    code, _, err = _run(lab, "--resume", ck)
    assert code == 1 and f"{ck / 'run.json'}: {where}" in err, err


@pytest.mark.parametrize("name, content, where", [
    ("model.pt", torch.zeros(3), "model.pt: error[E0735]: holds a Tensor"),
    ("model.pt", {"embed.weight": torch.zeros(2, 2)}, "model.pt: error[E0735]: does not hold Tiny's parameters"),
    ("optimizer.pt", {"state": {}, "param_groups": "x"}, "optimizer.pt: param_groups: error[E0735]"),
    ("optimizer.pt", [1, 2], "optimizer.pt: error[E0735]: is not an optimizer state"),
    ("counters.pt", {"schedule": {}, "step": 1}, "counters.pt: error[E0735]: is not a counters file"),
])
def test_state_files_of_the_wrong_structure_are_located(lab: Path, tmp_path: Path, name: str, content: object,
                                                       where: str) -> None:
    ck = copy(lab / "ck", tmp_path / "ck")
    rewrite(ck, name, _torch(content))
    code, _, err = _run(lab, "--resume", ck)
    assert code == 1 and f"{ck / where}" in err and "Traceback" not in err, err


def test_counters_with_a_bad_rng_state_and_diverge_of_other_sizes(lab: Path, tmp_path: Path) -> None:
    ck = copy(lab / "ck", tmp_path / "ck")
    counters = torch.load(ck / "counters.pt", weights_only=True)
    counters["rng"]["torch"] = torch.zeros(5056, dtype=torch.uint8)
    rewrite(ck, "counters.pt", _torch(counters))
    code, _, err = _run(lab, "--resume", ck)
    assert code == 1 and f"{ck / 'counters.pt'}: rng.torch: error[E0735]: is not a valid generator state" in err
    wide = tmp_path / "wide.block"
    wide.write_text((lab / "tiny.block").read_text().replace("model = 8", "model = 16"))
    code, _, err = cli("diverge", wide, *DIMS, "--checkpoint-a", lab / "ck")
    assert code == 1 and f"{lab / 'ck' / 'model.pt'}: layers.0.ln_1.weight: error[E0735]: is torch.float32 [8]; " \
        "Tiny declares torch.float32 [16]" in err, err


# --- run options ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("option, value, message", [
    ("--lr", "nan", "--lr must be a finite positive learning rate, got nan"),
    ("--lr", "inf", "--lr must be a finite positive learning rate, got inf"),
    ("--lr", "-1", "--lr must be a finite positive learning rate, got -1.0"),
    ("--batch", "0", "--batch must be at least 1 window a step, got 0"),
    ("--seed", "-3", "--seed must be an integer in [0, 2**63), got -3"),
    ("--warmup", "-1", "--warmup must be an integer of at least 0, got -1"),
    ("--steps", "-1", "--steps must be an integer of at least 0, got -1"),
])
def test_bad_run_options_are_usage_errors(lab: Path, option: str, value: str, message: str) -> None:
    code, _, err = cli("run", lab / "tiny.block", *DIMS, "--data", lab / "data.txt", option, value)
    assert (code, err.strip()) == (2, f"blockir: {message}")


def test_buffers_that_would_not_fit_and_short_validation_data_are_refused(lab: Path, tmp_path: Path) -> None:
    code, _, err = _run(lab, "--batch", str(10 ** 9))
    assert code == 1 and "error[E0706]: training 'Tiny' at these sizes would keep at least" in err
    code, _, err = cli("compare", lab / "tiny.block", lab / "tiny.block", *DIMS, "--data", lab / "data.txt",
                       "--steps", str(10 ** 9))
    assert code == 1 and "error[E0722]" in err and "windows of 9 bytes would take" in err
    short = tmp_path / "short.txt"
    short.write_bytes(b"x" * 70)  # 63 training bytes, 7 validation bytes: less than one window of 9
    code, _, err = cli("run", lab / "tiny.block", *DIMS, "--data", short, "--steps", "1")
    assert code == 1 and "the validation split of" in err and "holds 7 bytes, fewer than one window of 9" in err


# --- key maps ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("rename:\n  layers.{i}.{i}.weight: x.{i}\n", "binds i more than once"),
    ("rename:\n  a}b{c: d\n", "is not a key pattern"),
    ("drop: [a]\ndrop: [b]\n", "section 'drop' appears twice"),
    ("rename:\n  a: b\n  a: c\n", "'a' is renamed twice"),
    ("rename: " + "[" * 5000 + "]" * 5000 + "\n",
     "exceeded maximum nesting depth" if yaml.__with_libyaml__ else "nests deeper"),
])
def test_malformed_key_maps_are_located(lab: Path, tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "m.yaml").write_text(text)
    code, _, err = cli("migrate", lab / "tiny.block", lab / "renamed.block", "--checkpoint", lab / "ck",
                       "--map", tmp_path / "m.yaml")
    assert code == 1 and f"{tmp_path / 'm.yaml'}:" in err and "error[E0727]" in err and message in err, err
