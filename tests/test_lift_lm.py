"""Lift on whole causal LMs built from configs: the embedding, the stack of layers, the final norm and the
head (tied or not) become one ``model``, certified against the original's logits and every parameter gradient,
with the original ``state_dict`` loading strictly into the compiled lift."""
from __future__ import annotations

import pytest
import torch

import blockir
from lift_models import one_thread  # noqa: F401  (fixture)


def _llama(tied: bool) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, max_position_embeddings=64, tie_word_embeddings=tied)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("tied", [False, True])
def test_a_llama_causal_lm_lifts_as_one_model(tied: bool) -> None:
    model = _llama(tied)
    result = blockir.lift(model, _ids())
    assert result.diagnostics == [], result.render()
    assert result.max_error == 0.0
    model_text = result.text[result.text.index("model LlamaForCausalLM"):]
    assert model_text == f"""\
model LlamaForCausalLM(ids: [B, S]) -> [B, S, V] {{
  model.embed_tokens: embedding(V, D)
  model.norm: rmsnorm(D, eps=1e-06, cast=before_weight)
  lm_head: head(V, tied={'true' if tied else 'false'})
  model.layers: LlamaDecoderLayer * 2
  embedded = model.embed_tokens(ids)
  layer_1 = model.layers(embedded)
  normed = model.norm(layer_1)
  logits = lm_head(normed)
  return logits
}}
"""
    assert "  self_attn: self_attention(heads=4, kv_heads=2, causal=true, rope=true, impl=eager)\n" in result.text
    assert "dim V: vocab = 64\n" in result.text
    assert result.program is not None
    compiled = blockir.compile(result.program, result.block, dims={"B": 2, "S": 5})
    loaded = compiled.load_state_dict(model.state_dict(), strict=True)
    assert (loaded.missing_keys, loaded.unexpected_keys) == ([], [])
    assert (compiled.lm_head.weight is compiled.get_parameter("model.embed_tokens.weight")) == tied
    assert model.training is False and all(p.grad is None for p in model.parameters())


def test_a_model_without_a_stack_on_its_embedding_is_e0913() -> None:
    class Bag(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(64, 32)
            self.out = torch.nn.Linear(32, 64)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.out(self.embed(ids))

    (d,) = blockir.lift(Bag(), _ids()).diagnostics
    assert (d.code, d.message, d.span.filename) == ("E0913", "no list of layers reads what the embedding returns",
                                                    __file__)
