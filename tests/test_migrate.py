"""Checkpoint migration: a reviewed key map, new state under its recipe, refused function changes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from blockir.analyses.migration import parse_key_map
from blockir.cli import main
from blockir.diagnostics import BlockError

ROOT = Path(__file__).resolve().parent.parent
LLAMA_TEXT = (ROOT / "examples" / "llama.block").read_text()
RUN = ["--dims", "B=2,S=16", "--steps", "2"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A source program, its 2-step checkpoint and the candidates a migration is tried on."""
    d = tmp_path_factory.mktemp("migrate")
    (d / "data.txt").write_bytes((ROOT / "blockir" / "cli.py").read_bytes() * 4)
    (d / "llama.block").write_text(LLAMA_TEXT)
    (d / "renamed.block").write_text(LLAMA_TEXT.replace("input_layernorm", "attn_norm"))
    (d / "post.block").write_text(LLAMA_TEXT.replace("h = x + self_attn(input_layernorm(x))",
                                                     "h = input_layernorm(x + self_attn(x))")
                                  .replace("y = h + mlp(post_attention_layernorm(h))",
                                           "y = post_attention_layernorm(h + mlp(h))"))
    (d / "dyt.block").write_text(LLAMA_TEXT.replace(
        "input_layernorm: rmsnorm(D, eps=1e-6, offset=0, cast=before_weight, accum=f32)",
        "input_layernorm: dyt(D, alpha=0.5)"))
    (d / "map.yaml").write_text("rename:\n  layers.{i}.input_layernorm.weight: layers.{i}.attn_norm.weight\n")
    assert main(["run", str(d / "llama.block"), *RUN, "--data", str(d / "data.txt"), "--save", str(d / "ck")]) == 0
    return d


def _migrate(lab: Path, dst: str, *extra: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["migrate", str(lab / "llama.block"), str(lab / dst), "--checkpoint", str(lab / "ck"),
                 "--format", "json", *extra])
    return code, json.loads(capsys.readouterr().out)


def _losses(path: Path, ckpt: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> list[float]:
    capsys.readouterr()
    assert main(["run", str(path), *RUN, "--data", str(data), "--resume", str(ckpt), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)["losses"]


def test_renamed_keys_convert_exactly_and_resume_as_the_source(lab: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = lab / "renamed_ck"
    code, report = _migrate(lab, "renamed.block", "--map", str(lab / "map.yaml"), "--out", str(out), capsys=capsys)
    assert code == 0
    assert report["status"] == "converted" and report["function"]["verdict"] == "same"
    assert report["keys"]["renamed"] == [
        {"from": "layers.0.input_layernorm.weight", "to": "layers.0.attn_norm.weight"},
        {"from": "layers.1.input_layernorm.weight", "to": "layers.1.attn_norm.weight"}]
    assert report["keys"]["new"] == [] and report["optimizer"]["fresh"] == []
    assert report["check"]["max_abs_error"] == 0.0 and report["zero_error_claim"] is True
    # the written report is the printed one, hashed in run.json beside the checkpoint's files
    assert yaml.safe_load((out / "conversion.yaml").read_text()) == report
    assert "conversion.yaml" in json.loads((out / "run.json").read_text())["sha256"]
    src = torch.load(lab / "ck" / "model.pt", weights_only=True)
    dst = torch.load(out / "model.pt", weights_only=True)
    assert torch.equal(src["core.layers.1.input_layernorm.weight"], dst["core.layers.1.attn_norm.weight"])
    # moments and counters moved with the weights: training goes on exactly as the source's would
    assert _losses(lab / "renamed.block", out, lab / "data.txt", capsys) == \
        _losses(lab / "llama.block", lab / "ck", lab / "data.txt", capsys)


def test_new_layerscale_is_initialised_by_its_recipe(lab: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipe", "layerscale", str(lab / "llama.block"), "--block", "LlamaDecoderLayer"]) == 0
    (lab / "ls.block").write_text(capsys.readouterr().out)
    out = lab / "ls_ck"
    code, report = _migrate(lab, "ls.block", "--out", str(out), capsys=capsys)
    assert code == 0 and report["function"]["verdict"] == "extends"
    assert [n["key"] for n in report["keys"]["new"]] == \
        ["layers.0.ls1.gamma", "layers.0.ls2.gamma", "layers.1.ls1.gamma", "layers.1.ls2.gamma"]
    assert report["keys"]["new"][0]["initialised_by"] == "ls1.gamma: vector(D, init=0.1, offset=0)"
    assert report["optimizer"]["fresh"] == [f"core.layers.{i}.ls{j}.gamma" for i in (0, 1) for j in (1, 2)]
    # the gain changes the function by its initial value: measured, and no zero-error claim
    assert report["check"]["max_abs_error"] > report["check"]["bound"]
    assert report["zero_error_claim"] is False and "training" in report["evidence_required"]
    state = torch.load(out / "model.pt", weights_only=True)
    assert torch.equal(state["core.layers.1.ls2.gamma"], torch.full((64,), 0.1))
    src = torch.load(lab / "ck" / "model.pt", weights_only=True)
    assert torch.equal(state["core.layers.0.mlp.down_proj.weight"], src["core.layers.0.mlp.down_proj.weight"])


@pytest.mark.parametrize("dst, reason", [("post.block", "different functions"), ("dyt.block", "new state")])
def test_function_changing_migration_is_refused(lab: Path, dst: str, reason: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = lab / f"refused_{dst}"
    capsys.readouterr()
    code = main(["migrate", str(lab / "llama.block"), str(lab / dst), "--checkpoint", str(lab / "ck"),
                 "--out", str(out)])
    captured = capsys.readouterr()
    report = yaml.safe_load(captured.out)
    assert code == 1 and not out.exists(), captured.err
    assert report["status"] == "refused" and report["function"]["verdict"] == "changes"
    assert reason in report["function"]["reason"] and report["zero_error_claim"] is False
    assert report["function"]["first_difference"]["candidate"].startswith(f"{lab / dst}:29:")
    assert f"{lab / dst}:29:" in captured.err and "error[E0726]" in captured.err
    # accepting the change converts it, still without a zero-error claim
    code, report = _migrate(lab, dst, "--out", str(out), "--allow-function-change", capsys=capsys)
    assert code == 0 and report["status"] == "converted" and report["zero_error_claim"] is False


def test_unaccounted_and_unmatched_keys_are_located(lab: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    # without the map, the renamed norm's source key has no place in the candidate
    assert main(["migrate", str(lab / "llama.block"), str(lab / "renamed.block"), "--checkpoint",
                 str(lab / "ck")]) == 1
    err = capsys.readouterr().err
    assert "error[E0727]: source key 'layers.0.input_layernorm.weight' has no place in the candidate" in err
    assert f"{lab / 'llama.block'}:25:3" in err  # input_layernorm's declaration
    (lab / "bad.yaml").write_text("rename:\n  layers.{i}.input_layernorm.weight: layers.{i}.attn_norm.weight\n"
                                  "drop: [layers.9.nothing]\n")
    assert main(["migrate", str(lab / "llama.block"), str(lab / "renamed.block"), "--checkpoint", str(lab / "ck"),
                 "--map", str(lab / "bad.yaml")]) == 1
    assert f"{lab / 'bad.yaml'}:3:8: error[E0727]: 'layers.9.nothing' matches no key" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [
    ("rename: [a]\n", "rename maps source keys"),
    ("move: {a: b}\n", "unknown section 'move'"),
    ("rename:\n  a.{i}: b.{j}\n", "uses j, which its source pattern does not bind"),
    ("rename: {a: [\n", "not valid YAML"),
])
def test_malformed_key_maps(text: str, message: str) -> None:
    with pytest.raises(BlockError) as exc:
        parse_key_map(text, "m.yaml")
    d = exc.value.diagnostics[0]
    assert d.code == "E0727" and message in d.message and d.span.filename == "m.yaml" and d.span.line >= 1
