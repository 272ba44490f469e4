"""``blockir.from_pretrained``: the folder layouts transformers writes, tied tables, dtypes, and every bad folder
as a located diagnostic; the forward contract's refusals."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

import blockir  # noqa: E402
from hf_families import FAMILIES  # noqa: E402


def _real(family: str = "llama", **changes: Any) -> Any:
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(**{**FAMILIES[family], **changes})
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    real = _real()
    folder = tmp_path_factory.mktemp("llama")
    real.save_pretrained(folder)
    return real, folder


def _copy(saved: tuple[Any, Path], tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(saved[1], folder)
    return folder


def _error(folder: Path, **options: Any) -> Any:
    with pytest.raises(blockir.BlockError) as info:
        blockir.from_pretrained(folder, **options)
    (d,) = info.value.diagnostics
    return d


def _same(lm: Any, real: Any) -> None:
    ids = torch.randint(3, 97, (2, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(lm(ids).logits, real(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_sharded_safetensors_load_through_their_index(tmp_path: Path) -> None:
    real = _real()
    real.save_pretrained(tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    _same(blockir.from_pretrained(tmp_path), real)


def test_pytorch_model_bin_loads_with_weights_only(tmp_path: Path) -> None:
    real = _real()
    real.config.save_pretrained(tmp_path)
    torch.save(real.state_dict(), tmp_path / "pytorch_model.bin")
    _same(blockir.from_pretrained(tmp_path), real)


def test_a_pickle_that_runs_code_is_refused(tmp_path: Path, saved) -> None:
    folder = _copy(saved, tmp_path)
    (folder / "model.safetensors").unlink()
    torch.save({"model.norm.weight": torch.ones(32), "opt": object()}, folder / "pytorch_model.bin")
    d = _error(folder)
    assert d.code == "E0833" and d.span.filename == str(folder / "pytorch_model.bin")
    assert d.message.startswith("cannot read pytorch_model.bin as PyTorch weights: ")


@pytest.mark.parametrize("family", ["llama-tied", "qwen2", "gemma", "gpt2"])
def test_a_tied_head_is_one_parameter_as_in_hf(family: str, tmp_path: Path) -> None:
    real = _real(family)
    real.save_pretrained(tmp_path)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")  # HF stores the shared table once
    lm = blockir.from_pretrained(tmp_path)
    head = lm.get_submodule("lm_head").weight
    table = next(m.weight for n, m in lm.named_modules() if n.endswith(("embed_tokens", "wte")))
    assert head is table
    assert sum(p.numel() for p in lm.parameters()) == sum(p.numel() for p in real.parameters())
    _same(lm, real)


def test_both_copies_of_a_tied_table_load_as_one(tmp_path: Path) -> None:
    real = _real("llama-tied")
    real.config.save_pretrained(tmp_path)
    state = {k: v.clone() for k, v in real.state_dict().items()}
    assert "lm_head.weight" in state
    save_file(state, tmp_path / "model.safetensors")
    lm = blockir.from_pretrained(tmp_path)
    assert lm.get_submodule("lm_head").weight is lm.get_submodule("model.embed_tokens").weight


def test_dtype_comes_from_the_config_unless_given(tmp_path: Path) -> None:
    real = _real().to(torch.bfloat16)
    real.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    lm = blockir.from_pretrained(tmp_path)
    assert {p.dtype for p in lm.parameters()} == {torch.bfloat16}
    state = load_file(tmp_path / "model.safetensors")
    assert all(torch.equal(lm.state_dict()[k], v) for k, v in state.items())
    wide = blockir.from_pretrained(tmp_path, dtype=torch.float32, device="cpu")
    assert {(p.dtype, p.device.type) for p in wide.parameters()} == {(torch.float32, "cpu")}


def test_the_model_is_built_on_the_meta_device(saved, monkeypatch: pytest.MonkeyPatch) -> None:
    """No parameter memory is allocated before loading: the only real tensors are the ones read from the file."""
    devices: list[str] = []
    randn = torch.randn

    def recording(*args: Any, **kwargs: Any) -> Any:
        out = randn(*args, **kwargs)
        devices.append(out.device.type)
        return out
    monkeypatch.setattr(torch, "randn", recording)
    lm = blockir.from_pretrained(saved[1])
    assert devices and set(devices) == {"meta"}  # the tables' initialisation ran, on meta
    state = load_file(saved[1] / "model.safetensors")
    assert all(torch.equal(lm.state_dict()[k], v) for k, v in state.items())
    assert not any(p.is_meta for p in lm.parameters())


def test_a_folder_without_config_is_located(tmp_path: Path) -> None:
    d = _error(tmp_path)
    assert (d.code, str(d.span), d.message) == ("E0830", str(tmp_path / "config.json"), "the folder has no config.json")
    d = _error(tmp_path / "nowhere")
    assert (d.code, d.message) == ("E0830", f"{tmp_path / 'nowhere'} is not a model folder (no such directory)")


def test_a_config_that_is_not_json_points_at_the_character(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{\n  "model_type": "llama",\n  oops\n}')
    d = _error(tmp_path)
    assert (d.code, str(d.span), d.message) == ("E0830", f"{tmp_path / 'config.json'}:3:3",
                                                "config.json is not JSON: Expecting property name enclosed in double quotes")


def test_a_folder_without_weights(tmp_path: Path, saved) -> None:
    folder = _copy(saved, tmp_path)
    (folder / "model.safetensors").unlink()
    d = _error(folder)
    assert d.code == "E0831" and d.message.startswith("the folder has no weights: expected model.safetensors")


def _sharded(tmp_path: Path) -> tuple[Path, dict]:
    _real().save_pretrained(tmp_path, max_shard_size="20KB")
    index_path = tmp_path / "model.safetensors.index.json"
    return index_path, json.loads(index_path.read_text())


def test_an_index_naming_a_missing_shard(tmp_path: Path) -> None:
    index_path, index = _sharded(tmp_path)
    key, shard = next(iter(index["weight_map"].items()))
    (tmp_path / shard).unlink()
    d = _error(tmp_path)
    assert (d.code, str(d.span), d.message) == ("E0832", f"{index_path}: weight_map.{key}",
                                                f"shard {shard!r} is missing from the folder")


@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors"])
def test_an_index_cannot_lead_out_of_the_folder(name: str, tmp_path: Path) -> None:
    index_path, index = _sharded(tmp_path / "m")
    (tmp_path / "outside.safetensors").write_bytes(b"")
    key = next(iter(index["weight_map"]))
    index["weight_map"][key] = name
    index_path.write_text(json.dumps(index))
    d = _error(tmp_path / "m")
    assert (d.code, str(d.span), d.message) == ("E0832", f"{index_path}: weight_map.{key}",
                                                f"weight file {name!r} lies outside the model folder")


def test_a_truncated_safetensors_file(tmp_path: Path, saved) -> None:
    folder = _copy(saved, tmp_path)
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    d = _error(folder)
    assert d.code == "E0833" and str(d.span) == str(path)
    assert d.message.startswith("cannot read model.safetensors as safetensors: ")


def test_weights_of_another_shape(tmp_path: Path, saved) -> None:
    folder = _copy(saved, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, intermediate_size=40)))
    d = _error(folder)
    assert d.code == "E0836" and str(d.span) == f"{folder / 'model.safetensors'}: model.layers.0.mlp.down_proj.weight"
    assert d.message == ("model.layers.0.mlp.down_proj.weight has shape [32, 48] in model.safetensors, but the "
                         "model built from config.json expects [32, 40]")


def test_a_missing_and_an_unexpected_tensor(tmp_path: Path, saved) -> None:
    folder = _copy(saved, tmp_path)
    state = load_file(folder / "model.safetensors")
    norm = state.pop("model.norm.weight")
    save_file(state, folder / "model.safetensors")
    d = _error(folder)
    assert (d.code, d.message) == ("E0834", "no weight file of the folder holds model.norm.weight")
    save_file({**state, "model.norm.weight": norm, "model.extra.weight": norm.clone()}, folder / "model.safetensors")
    d = _error(folder)
    assert (d.code, str(d.span)) == ("E0835", f"{folder / 'model.safetensors'}: model.extra.weight")


def test_a_dtype_blockir_does_not_load(tmp_path: Path, saved) -> None:
    folder = _copy(saved, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, dtype="int8")))
    d = _error(folder)
    assert (d.code, str(d.span)) == ("E0837", f"{folder / 'config.json'}: dtype")


@pytest.mark.parametrize("architecture", ["BertForMaskedLM", "RobertaForMaskedLM", "BertModel"])
def test_an_encoder_folder_loads_as_its_compiled_module(architecture: str, tmp_path: Path) -> None:
    """A masked LM or a base encoder (saved without the pooler, which the file does not hold) loads strictly, its
    output HF's; the masked LM's tied table and shared bias are one tensor each, as HF saved one name of each."""
    torch.manual_seed(0)
    model_type = "roberta" if architecture.startswith("Roberta") else "bert"
    cfg = transformers.AutoConfig.for_model(model_type=model_type, vocab_size=97, hidden_size=32, num_hidden_layers=1,
                                            num_attention_heads=4, intermediate_size=48, architectures=[architecture])
    real = getattr(transformers, architecture)(cfg, **({} if "Masked" in architecture else
                                                       {"add_pooling_layer": False})).eval()
    with torch.no_grad():  # HF starts biases at zero, which would hide one read from the wrong tensor
        for p in real.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    real.save_pretrained(tmp_path)
    model = blockir.from_pretrained(tmp_path)
    assert not hasattr(model, "generate") and model.blockir_block == architecture
    ids = torch.randint(3, 97, (2, 6), generator=torch.Generator().manual_seed(1))
    keep = torch.ones(2, 6, dtype=torch.long)
    keep[1, -2:] = 0
    with torch.no_grad():
        out = real(input_ids=ids, attention_mask=keep)
        want = out.logits if "Masked" in architecture else out.last_hidden_state
        got = model(ids, torch.zeros_like(ids), attention_mask=keep)
    assert torch.allclose(got[keep.bool()], want[keep.bool()], rtol=1e-5, atol=1e-6)
    assert len(list(model.parameters())) == len(list(real.parameters()))


def test_generate_and_run_refuse_an_encoder_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from blockir.cli import main
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(model_type="bert", vocab_size=300, hidden_size=32, num_hidden_layers=1,
                                            num_attention_heads=4, intermediate_size=48,
                                            architectures=["BertForMaskedLM"])
    transformers.BertForMaskedLM(cfg).save_pretrained(tmp_path)
    for argv in (["generate", str(tmp_path), "--prompt", "hi"], ["run", str(tmp_path), "--steps", "1"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert f"{tmp_path / 'config.json'}: model_type: error[E0842]: BertForMaskedLM is not a causal language " \
               "model (no LM head over causal attention): it neither generates nor trains on next tokens" in err


def test_a_model_type_the_importer_does_not_write(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert _error(tmp_path).code == "E0800"


def test_the_forward_refuses_what_it_does_not_read(saved) -> None:
    lm = blockir.from_pretrained(saved[1])
    ids = torch.randint(3, 97, (2, 5))
    cases = [(dict(labels=ids), "LlamaForCausalLM takes no keyword 'labels'"),
             (dict(attention_mask=torch.ones(2, 4, dtype=torch.long)),
              "attention_mask must be [batch, past + seq] = [2, 5] (the cached positions and these), got [2, 4]"),
             (dict(position_ids=torch.zeros(1, 3, dtype=torch.long)),
              "position_ids must be integer positions [batch or 1, 5], got [1, 3]"),
             (dict(past_key_values=()), "past_key_values must be a blockir KVCache, got tuple")]
    for kwargs, message in cases:
        with pytest.raises(blockir.BlockError) as info:
            lm(ids, **kwargs)
        assert [(d.code, d.message) for d in info.value.diagnostics] == [("E0838", message)]
    cache = lm(ids, use_cache=True).past_key_values
    with pytest.raises(blockir.BlockError) as info:
        lm(ids[:1, :1], past_key_values=cache)
    assert info.value.diagnostics[0].code == "E0840"


def test_import_hf_reads_a_folder(saved, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from blockir.cli import main
    from blockir.api import hf_block_text as block_text

    assert main(["import", "hf", str(saved[1])]) == 0
    assert capsys.readouterr().out == block_text(json.loads((saved[1] / "config.json").read_text()))
    assert main(["import", "hf", str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith(f"{tmp_path / 'config.json'}: error[E0805]: the folder holds no config.json")
