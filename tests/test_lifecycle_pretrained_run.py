"""`blockir run` on transformers folders and token-id models: losses equal a plain PyTorch loop over transformers'
own model; --accum equals one larger batch; bf16, torch.compile and devices; located refusals."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.nn import functional as F  # noqa: E402

import blockir  # noqa: E402
from blockir.api import hf_block_text, parse  # noqa: E402
from blockir.cli import main  # noqa: E402
from blockir.lifecycle.corpus import load_corpus, sample_starts, windows  # noqa: E402
from blockir.lifecycle.pretrained import pretrained_for_training  # noqa: E402
from blockir.lifecycle.session import RunConfig, Trainer, train  # noqa: E402
from hf_families import FAMILIES  # noqa: E402

SEQ, BATCH = 16, 2
CONFIGS = {"llama": dict(FAMILIES["llama"], vocab_size=300),
           "gpt2": dict(FAMILIES["gpt2"], vocab_size=260, embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0)}


def _real(family: str) -> Any:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**CONFIGS[family]))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text("".join(p.read_text() for p in sorted(Path(blockir.__file__).parent.glob("*.py"))[:6]))
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Path]]:
    out = {}
    for family in CONFIGS:
        real, folder = _real(family), tmp_path_factory.mktemp(family)
        real.save_pretrained(folder)
        out[family] = (real, folder)
    return out


def plain_loop(real: Any, data: Path, steps: int, batch: int) -> list[float]:
    """The hand-written loop: transformers' model, the run's windows (same sampler seed), AdamW as the run's."""
    corpus = load_corpus(str(data))
    real = copy.deepcopy(real).train()
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(real.parameters(), lr=3e-3, weight_decay=0.01)
    losses = []
    for _ in range(steps):
        w = windows(corpus.train, sample_starts(corpus.train, batch, SEQ + 1, gen), SEQ + 1)
        logits = real(input_ids=w[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _trainer(folder: Path, data: Path, **cfg: Any) -> Trainer:
    lm = pretrained_for_training(folder)
    program = lm.program
    options = {"steps": 3, "dims": {"B": BATCH, "S": SEQ}, "data": str(data), **cfg}
    return Trainer(program, program.block(lm.name), RunConfig(**options), load_corpus(str(data)), lm.compiled)


def _run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["run", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_cli_trains_a_llama_folder_as_a_plain_loop_over_transformers_does(
        folders: dict[str, tuple[Any, Path]], data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real, folder = folders["llama"]
    out = _run_json(capsys, str(folder), "--steps", "3", "--dims", f"B={BATCH},S={SEQ}", "--data", str(data))
    assert out["losses"] == pytest.approx(plain_loop(real, data, 3, BATCH), rel=1e-5)
    assert [s["site"] for s in out["sites"]][:2] == ["model.layers.0.h", "model.layers.0.y"]


def test_python_trains_a_gpt2_folder_as_a_plain_loop_does(folders: dict[str, tuple[Any, Path]], data: Path) -> None:
    real, folder = folders["gpt2"]
    trainer = _trainer(folder, data)
    report = train(trainer, 3)
    assert list(report.losses) == pytest.approx(plain_loop(real, data, 3, BATCH), rel=1e-5)
    tied = trainer.model.core.get_parameter("lm_head.weight")
    assert tied is trainer.model.core.get_parameter("transformer.wte.weight")  # one table, trained once


def test_a_folder_run_resumes_bit_for_bit(folders: dict[str, tuple[Any, Path]], data: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    common = (str(folders["llama"][1]), "--dims", f"B={BATCH},S={SEQ}", "--data", str(data))
    first = _run_json(capsys, *common, "--steps", "2", "--save", str(tmp_path / "ck"))
    resumed = _run_json(capsys, *common, "--steps", "2", "--resume", str(tmp_path / "ck"))
    assert first["losses"] + resumed["losses"] == _run_json(capsys, *common, "--steps", "4")["losses"]


def test_accum_gives_the_loss_and_gradients_of_one_larger_batch(folders: dict[str, tuple[Any, Path]],
                                                              data: Path) -> None:
    trainer = _trainer(folders["llama"][1], data, accum=3)
    plain = copy.deepcopy(trainer.model)
    batch = trainer.next_batch()
    assert batch.shape == (3 * BATCH, SEQ + 1)
    loss = trainer.train_step(batch)
    logits = plain.core(batch[:, :-1], **plain.context())
    whole = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    whole.backward()
    assert loss == pytest.approx(whole.item(), rel=1e-6)
    grads = dict(plain.named_parameters())
    for name, p in trainer.model.named_parameters():
        assert torch.allclose(p.grad, grads[name].grad, rtol=1e-5, atol=1e-7), name


def test_accum_k_of_b_windows_trains_as_one_batch_of_k_b(folders: dict[str, tuple[Any, Path]], data: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    folder = str(folders["llama"][1])
    common = (folder, "--steps", "2", "--dims", f"S={SEQ}", "--data", str(data))
    split = _run_json(capsys, *common, "--batch", "2", "--accum", "2")
    whole = _run_json(capsys, *common, "--batch", "4")
    assert split["losses"] == pytest.approx(whole["losses"], rel=1e-5)
    assert split["losses"] == pytest.approx(plain_loop(folders["llama"][0], data, 2, 4), rel=1e-5)


def test_bf16_keeps_fp32_master_weights_and_tracks_the_fp32_losses(folders: dict[str, tuple[Any, Path]],
                                                                  data: Path) -> None:
    fp32 = train(_trainer(folders["llama"][1], data), 2).losses
    trainer = _trainer(folders["llama"][1], data, dtype="bf16")
    bf16 = train(trainer, 2).losses
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert all(o["exp_avg"].dtype == torch.float32 for o in trainer.optimizer.state.values())
    assert bf16 != fp32 and bf16 == pytest.approx(fp32, abs=2e-2)  # computed in bf16, close to fp32


@pytest.mark.slow  # importing torch._dynamo alone costs ~13 s of CPU here; the compiled step itself ~5 s
def test_a_compiled_forward_trains_as_the_eager_one(folders: dict[str, tuple[Any, Path]], data: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    common = (str(folders["gpt2"][1]), "--steps", "1", "--dims", f"B={BATCH},S={SEQ}", "--data", str(data))
    compiled = _run_json(capsys, *common, "--compile", "--compile-backend", "eager")
    assert compiled["losses"] == pytest.approx(_run_json(capsys, *common)["losses"], rel=1e-6)


def test_a_written_token_model_is_its_own_language_model(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = hf_block_text(CONFIGS["llama"])
    path = data.parent / "llama.block"
    path.write_text(text)
    out = _run_json(capsys, str(path), "--steps", "1", "--dims", f"B={BATCH},S={SEQ}", "--data", str(data))
    program = parse(text, str(path))
    core = blockir.compile(program, "LlamaForCausalLM", seed=0)
    w = windows(load_corpus(str(data)).train, sample_starts(load_corpus(str(data)).train, BATCH, SEQ + 1,
                                                            torch.Generator().manual_seed(0)), SEQ + 1)
    logits = core(w[:, :-1], position_ids=torch.arange(SEQ)[None])
    first = F.cross_entropy(logits.reshape(-1, 300), w[:, 1:].reshape(-1)).item()
    assert out["losses"][0] == pytest.approx(first, rel=1e-6)
    assert first == pytest.approx(math.log(300), abs=0.3)  # a fresh model knows no byte


def test_the_progress_bar_goes_to_stderr_and_json_stays_json(folders: dict[str, tuple[Any, Path]], data: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    argv = ["run", str(folders["gpt2"][1]), "--steps", "2", "--dims", f"B={BATCH},S={SEQ}", "--data", str(data),
            "--format", "json", "--progress", "on"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert len(json.loads(out)["losses"]) == 2
    assert "train: " in err and "step/s" in err and f"loss={json.loads(out)['losses'][1]:.4f}, step=2]" in err
    assert "step 1/2" not in err  # the bar replaces the per-step lines


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["run", *argv])
    return code, capsys.readouterr().err


def test_bad_arguments_are_located(folders: dict[str, tuple[Any, Path]], data: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    folder = str(folders["gpt2"][1])
    base = [folder, "--steps", "1", "--dims", f"B={BATCH},S={SEQ}", "--data", str(data)]
    code, err = _refused(capsys, [*base, "--device", "nodevice"])
    assert code == 1 and err.startswith("blockir run --device: error[E0845]: 'nodevice' is not a device name")
    if not torch.cuda.is_available():
        code, err = _refused(capsys, [*base, "--device", "cuda"])
        assert code == 1 and err.startswith("blockir run --device: error[E0845]: cannot train on device 'cuda'")
    code, err = _refused(capsys, [*base, "--compile", "--compile-backend", "nope"])
    assert code == 1 and err.startswith("blockir run --compile-backend: error[E0846]: torch.compile has no "
                                        "backend 'nope'")
    assert _refused(capsys, [*base, "--block", "X"]) == (2, f"blockir: {folder} is a model folder, which holds one "
                                                           "model; --block chooses a block of a .block file\n")
    assert _refused(capsys, [*base, "--accum", "0"]) == (2, "blockir: --accum must be an integer of at least 1, "
                                                            "got 0\n")
    small = tmp_path / "small"
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**FAMILIES["gpt2"])) \
        .save_pretrained(small)
    code, err = _refused(capsys, [str(small), "--steps", "1"])
    assert code == 1 and err.startswith(f"{small}/config.json: vocab_size: error[E0844]: the model has a "
                                        "vocabulary of 97 tokens")


TOKEN_MODEL = """dim B: batch
dim S: seq
dim D: model = 16
dim V: vocab = {vocab}

model Tiny(input_ids: [B, S]) -> {result} {{
  embed: embedding(V, D)
  mlp: mlp(D)
  lm_head: head(V)
  return {body}
}}
"""


def test_a_token_model_must_map_ids_to_byte_logits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.block"
    path.write_text(TOKEN_MODEL.format(vocab=100, result="[B, S, V]", body="lm_head(mlp(embed(input_ids)))"))
    code, err = _refused(capsys, [str(path), "--steps", "1"])
    assert code == 1 and err.startswith(f"{path}:4:5: error[E0844]: 'Tiny' has a vocabulary of 100 tokens")
    path.write_text(TOKEN_MODEL.format(vocab=300, result="[B, S, D]", body="mlp(embed(input_ids))"))
    code, err = _refused(capsys, [str(path), "--steps", "1"])
    assert code == 1 and err.startswith(f"{path}:6:7: error[E0843]: a token-id run trains 'Tiny' on next-token "
                                        "logits, but it takes 1 input and returns [B, S, D]")
