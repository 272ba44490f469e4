"""`blockir recipe`: the layer it picks without --block, and Admin's profile on a data file (its identity and
token budget)."""
from __future__ import annotations

import hashlib
import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

import blockir
from blockir.cli import main
from blockir.lifecycle.session import RunConfig, build_model
from conftest import ROOT

LLAMA = str(ROOT / "examples" / "llama.block")


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_without_block_the_recipe_rewrites_the_stacked_layer() -> None:
    code, out, err = run_cli("recipe", "fixup", LLAMA)
    assert code == 0, err
    assert err.startswith("Fixup on LlamaDecoderLayer\n")
    assert (code, out) == run_cli("recipe", "fixup", LLAMA, "--block", "LlamaDecoderLayer")[:2]


def test_two_stacked_layers_are_ambiguous() -> None:
    path = str(ROOT / "examples" / "encoder_decoder.block")
    code, out, err = run_cli("recipe", "tfixup", path)
    assert (code, out) == (1, "")
    assert err.splitlines()[0] == (
        f"{path}:47:3: error[E0713]: {path} stacks 2 different layers (EncoderLayer, DecoderLayer): which one the "
        "recipe rewrites is ambiguous")
    assert f"= note: {path}:41:3: 'Encoder' stacks 'EncoderLayer' here" in err
    assert f"= note: {path}:47:3: 'Decoder' stacks 'DecoderLayer' here" in err
    assert err.rstrip().endswith("= hint: choose one with --block (EncoderLayer, DecoderLayer)")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("admin") / "profile.txt"
    path.write_bytes((ROOT / "blockir" / "cli.py").read_bytes()[:3000])
    return path


@pytest.fixture(scope="module")
def admin_json(data: Path) -> dict:
    code, out, err = run_cli("recipe", "admin", LLAMA, "--data", str(data), "--tokens", "2000", "--dims",
                             "B=2,S=16", "--seed", "3", "--format", "json")
    assert code == 0, err
    return json.loads(out)


def test_admin_records_the_data_identity_and_budget(admin_json: dict, data: Path) -> None:
    record = admin_json["profile"]
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    assert (record["sha256"], record["data_tokens"], record["budget"], record["tokens"], record["seed"]) == \
        (digest, 3000, 2000, 2 * 17, 3)
    heading = admin_json["program"].splitlines()[0]
    assert heading == f"# Admin profile: 34 tokens (2 windows of 17 bytes) of {data}, sha256 {digest}"
    assert list(record["omega"]) == [f"layers.{i}.omega_{k}" for i in range(2) for k in (1, 2)]


def test_admin_omega_comes_from_the_data(admin_json: dict, data: Path) -> None:
    """omega_1 = sqrt(Var(x_0)), x_0 the embedded first 16 bytes of each of the two windows, recomputed here in
    float64 from the byte embedding the model is built with at that seed."""
    program = blockir.parse(admin_json["program"], "admin.block")
    model, _ = build_model(program, program.block("LlamaModel"), RunConfig(dims={"B": 2, "S": 16}, seed=3))
    rows = torch.tensor(list(data.read_bytes()[:34])).view(2, 17)[:, :16]
    x0 = model.embed.weight.detach().double()[rows]
    want = x0.var(unbiased=False).sqrt().item()
    assert admin_json["profile"]["omega"]["layers.0.omega_1"] == pytest.approx(want, rel=1e-6)
    omegas = list(admin_json["profile"]["omega"].values())
    assert all(b > a for a, b in zip(omegas, omegas[1:]))  # each branch adds its variance


def test_admin_writes_the_manifest_once(data: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "admin.json"
    argv = ("recipe", "admin", LLAMA, "--data", str(data), "--tokens", "100", "--dims", "B=1,S=8",
            "--manifest", str(manifest))
    code, out, err = run_cli(*argv)
    assert code == 0, err
    written = json.loads(manifest.read_text())
    assert written["program"] == out and written["profile"]["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert run_cli(*argv)[::2] == (2, f"blockir: --manifest {manifest} exists; it is never overwritten (give a new "
                                      "file)\n")


def test_admin_saves_the_profiled_initialisation_for_run_to_resume(data: Path, tmp_path: Path) -> None:
    """The step-0 checkpoint holds the omegas of the record, names the data by its sha256, and `blockir run
    --resume` continues it on the same data."""
    save, out = tmp_path / "ck", tmp_path / "admin.block"
    code, text, err = run_cli("recipe", "admin", LLAMA, "--data", str(data), "--tokens", "100", "--dims", "B=1,S=8",
                              "--save", str(save), "--format", "json")
    assert code == 0, err
    record = json.loads(text)
    run = json.loads((save / "run.json").read_text())
    assert (run["step"], run["data"], run["data_sha256"]) == (0, str(data), record["profile"]["sha256"])
    assert record["profile"]["checkpoint"] == {"directory": str(save), "model_sha256": run["sha256"]["model.pt"]}
    state = torch.load(save / "model.pt", weights_only=True)
    for path, omega in record["profile"]["omega"].items():
        assert torch.equal(state[f"core.{path}"], torch.full((64,), omega)), path
    out.write_text(record["program"])
    code, _, err = run_cli("run", str(out), "--resume", str(save), "--data", str(data), "--steps", "1",
                           "--progress", "off")
    assert code == 0, err


def test_admin_refuses_data_below_the_budget_and_a_batch_above_it(data: Path) -> None:
    code, _, err = run_cli("recipe", "admin", LLAMA, "--data", str(data), "--tokens", "8192")
    assert code == 1
    assert err.splitlines()[0] == (f"{data}:1:1: error[E0714]: the profile data {data} holds 3,000 tokens (bytes), "
                                   "fewer than the token budget of 8,192")
    code, _, err = run_cli("recipe", "admin", LLAMA, "--data", str(data), "--tokens", "500")
    assert code == 1
    assert err.splitlines()[0] == (f"{LLAMA}:34:18: error[E0714]: the profile batch of 'LlamaModel' is 8 windows "
                                   "of 65 bytes, 520 tokens, more than the token budget of 500")


TOKEN_LM = """dim B: batch
dim S: seq
dim D: model = 16
dim F: hidden = 32
dim V: vocab = 256

block Layer(x: [B, S, D]) -> [B, S, D] {
  attn: self_attention(heads=2, causal=true)
  ln_1: layernorm(D)
  mlp: mlp(F)
  ln_2: layernorm(D)
  h = ln_1(x + attn(x))
  y = ln_2(h + mlp(h))
  return y
}

model LM(input_ids: [B, S]) -> [B, S, V] {
  embed: embedding(V, D)
  layers: Layer * 2
  lm_head: head(V)
  return lm_head(layers(embed(input_ids)))
}
"""


def test_admin_refuses_a_model_that_reads_token_ids(data: Path, tmp_path: Path) -> None:
    path = tmp_path / "lm.block"
    path.write_text(TOKEN_LM)
    code, _, err = run_cli("recipe", "admin", str(path), "--data", str(data), "--tokens", "2000")
    assert code == 1
    assert err.splitlines()[0] == (f"{path}:17:10: error[E0715]: 'LM' reads token ids, so the profile's x_0 would "
                                   "be ids, not the stream the first sublayer reads")
