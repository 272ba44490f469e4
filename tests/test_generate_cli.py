"""`blockir generate FOLDER --prompt TEXT`: the folder's tokenizer when it has one, else bytes; errors located."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import blockir  # noqa: E402
from blockir.cli import main  # noqa: E402
from hf_families import FAMILIES  # noqa: E402


def _save(folder: Path, vocab: int) -> None:
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(**dict(FAMILIES["llama"], vocab_size=vocab))
    transformers.AutoModelForCausalLM.from_config(cfg).eval().save_pretrained(folder)


def test_without_a_tokenizer_the_bytes_are_the_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _save(tmp_path, 300)
    assert main(["generate", str(tmp_path), "--prompt", "héllo", "--max-new-tokens", "3"]) == 0
    ids = blockir.from_pretrained(tmp_path).generate(torch.tensor([list("héllo".encode())]), 3)[0].tolist()
    assert capsys.readouterr().out == bytes(i for i in ids if i < 256).decode("utf-8", errors="replace") + "\n"


def test_the_folders_tokenizer_encodes_and_decodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _save(tmp_path, 97)
    words = ["[UNK]", "the", "cat", "sat"] + [f"w{i}" for i in range(93)]
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]")
    raw = tokenizers.Tokenizer(model)
    raw.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    raw.decoder = tokenizers.decoders.WordPiece()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
    tok.save_pretrained(tmp_path)
    assert main(["generate", str(tmp_path), "--prompt", "the cat sat", "--max-new-tokens", "4"]) == 0
    ids = blockir.from_pretrained(tmp_path).generate(torch.tensor([[1, 2, 3]]), 4)[0].tolist()
    out = capsys.readouterr().out
    assert out == tok.decode(ids, skip_special_tokens=True) + "\n" and out.startswith("the cat sat")


def test_a_small_vocabulary_without_a_tokenizer_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _save(tmp_path, 97)
    capsys.readouterr()  # what saving printed
    assert main(["generate", str(tmp_path), "--prompt", "hi"]) == 1
    assert capsys.readouterr().err == (
        f"{tmp_path}: error[E0841]: the folder has no tokenizer, and its vocabulary of 97 tokens cannot hold the "
        "prompt's bytes\n  = hint: add the model's tokenizer files to the folder\n")


def test_a_broken_tokenizer_and_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _save(tmp_path, 300)
    (tmp_path / "tokenizer.json").write_text("{not json")
    assert main(["generate", str(tmp_path), "--prompt", "hi"]) == 1
    assert f"{tmp_path}: error[E0841]: cannot read the folder's tokenizer: " in capsys.readouterr().err
    assert main(["generate", str(tmp_path / "none"), "--prompt", "hi"]) == 1
    assert "error[E0830]" in capsys.readouterr().err
    assert main(["generate", str(tmp_path), "--prompt", "hi", "--max-new-tokens", "-1"]) == 2
