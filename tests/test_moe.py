"""The ``moe`` branch beyond the HF families' own routing: top-k-then-softmax against a float64 oracle, and
checkpoints whose experts are stored apart or stacked, complete or not."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

import blockir  # noqa: E402
from hf_families import FAMILIES  # noqa: E402

LAYER = """
dim B: batch
dim S: seq
dim D: model = 8
dim F: hidden = 6
dim G: hidden = 10
block L(x: [B, S, D]) -> [B, S, D] {
  mlp: moe(F, experts=5, top_k=3, routing=topk_softmax, act=gelu, shared=G)
  y = x + mlp(x)
  return y
}
"""


def test_topk_then_softmax_routing_equals_a_float64_oracle() -> None:
    module = blockir.compile(blockir.parse(LAYER), "L", dtype=torch.float64, seed=0).eval()
    state = {k.removeprefix("mlp."): v for k, v in module.state_dict().items()}
    x = torch.randn(2, 3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    gelu = torch.nn.functional.gelu
    want = x.clone()
    for b in range(2):
        for s in range(3):
            row = x[b, s]
            logits = state["gate.weight"] @ row
            top = torch.topk(logits, 3)
            weights = torch.softmax(top.values.float(), dim=-1)  # the routing weights are f32, as in HF
            for w, e in zip(weights, top.indices):
                gate, up = (state["experts.gate_up_proj"][e] @ row).chunk(2)
                want[b, s] += w * (state["experts.down_proj"][e] @ (gelu(gate) * up))
            shared = {k: state[f"shared_expert.{k}_proj.weight"] for k in ("gate", "up", "down")}
            want[b, s] += shared["down"] @ (gelu(shared["gate"] @ row) * (shared["up"] @ row))
    with torch.no_grad():
        assert torch.allclose(module(x), want, rtol=1e-12, atol=1e-12)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    torch.manual_seed(0)
    real = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**FAMILIES["qwen2_moe"]))
    folder = tmp_path_factory.mktemp("qwen2_moe")
    real.eval().save_pretrained(folder)
    return real, folder


def _folder(saved: tuple[Any, Path], tmp_path: Path, state: dict[str, Any]) -> Path:
    saved[0].config.save_pretrained(tmp_path)
    save_file(state, tmp_path / "model.safetensors")
    return tmp_path


def test_experts_stored_apart_are_stacked_and_stacked_ones_load_as_they_are(saved, tmp_path: Path) -> None:
    real, folder = saved
    stored = load_file(folder / "model.safetensors")
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in stored  # how transformers 5 saves a mixture
    assert "model.layers.0.mlp.experts.gate_up_proj" not in stored
    stacked = _folder(saved, tmp_path, {k: v.contiguous() for k, v in real.state_dict().items()})
    ids = torch.randint(3, 97, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = real(input_ids=ids).logits
        for path in (folder, stacked):
            assert torch.equal(blockir.from_pretrained(path)(ids).logits, want)


@pytest.mark.parametrize("change, code, message", [
    (lambda s: s.pop("model.layers.1.mlp.experts.2.up_proj.weight"), "E0834",
     "the checkpoint stores 7 of the 8 expert matrices of model.layers.1.mlp.experts.gate_up_proj (none for expert 2)"),
    (lambda s: s.update({"model.layers.0.mlp.experts.1.down_proj.weight": torch.zeros(32, 20)}), "E0836",
     "model.layers.0.mlp.experts.1.down_proj.weight has shape [32, 20] in model.safetensors, but the model built from "
     "config.json stacks 4 experts of [32, 24]"),
])
def test_an_incomplete_or_misshapen_expert_is_refused(change, code: str, message: str, saved, tmp_path: Path) -> None:
    state = load_file(saved[1] / "model.safetensors")
    change(state)
    with pytest.raises(blockir.BlockError) as info:
        blockir.from_pretrained(_folder(saved, tmp_path, state))
    (d,) = info.value.diagnostics
    assert (d.code, d.message) == (code, message)


@pytest.mark.parametrize("family, change, code, path, message", [
    ("qwen2_moe", dict(mlp_only_layers=[1]), "E0800", "$.mlp_only_layers",
     "dense MLP layers (mlp_only_layers) are not supported"),
    ("qwen3_moe", dict(decoder_sparse_step=2), "E0800", "$.decoder_sparse_step",
     "decoder_sparse_step=2 (dense MLP layers between the sparse ones) is not supported"),
    ("mixtral", dict(num_experts_per_tok=5), "E0809", "$.num_experts_per_tok",
     "num_experts_per_tok=5 exceeds num_local_experts=4"),
    ("olmoe", dict(num_experts_per_tok=5), "E0809", "$.num_experts_per_tok", "num_experts_per_tok=5 exceeds num_experts=4"),
])
def test_a_config_the_mixture_cannot_state_is_refused_at_its_field(family: str, change: dict, code: str, path: str,
                                                                   message: str) -> None:
    with pytest.raises(blockir.BlockError) as info:
        blockir.from_hf_config(dict(FAMILIES[family], **change))
    (d,) = info.value.diagnostics
    assert (d.code, d.span.filename.rpartition(": ")[2], d.message) == (code, path, message)
