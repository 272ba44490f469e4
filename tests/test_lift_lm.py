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


def _gpt2(impl: str = "eager", **dropout: float) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=16, bos_token_id=0,
                        eos_token_id=0, **dropout)
    config._attn_implementation = impl
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def gpt2() -> tuple[torch.nn.Module, blockir.LiftResult]:
    model = _gpt2()
    return model, blockir.lift(model, _ids())


def test_a_gpt2_causal_lm_lifts_whole_with_its_position_table_and_dropouts(gpt2) -> None:
    model, result = gpt2
    assert result.diagnostics == [], result.render()
    assert result.max_error == 0.0
    assert result.text.startswith("dim B: batch\ndim S: seq\ndim D: model = 32\ndim V: vocab = 64\n"
                                  "dim P: vocab = 16\n")
    # the fused Conv1D attention is the built-in; its resid_dropout drops the update, its attn_pdrop the
    # probabilities; embd_pdrop drops the sum of the two lookups before the first layer
    assert """\
  attn: self_attention(heads=4, causal=true, bias=true, out_bias=true, dropout=0.1, impl=eager, fused=stacked, \
conv1d=true, qkv=c_attn, o=c_proj)
  ln_2: layernorm(D, eps=1e-05)
  mlp: extern(x: [B, S, D]) -> [B, S, D]
  layer_norm = ln_1(hidden_states)
  getitem = dropout(attn(layer_norm), p=0.1)
""" in result.text
    assert result.text[result.text.index("model GPT2LMHeadModel"):] == """\
model GPT2LMHeadModel(ids: [B, S]) -> [B, S, V] {
  transformer.wte: embedding(V, D)
  transformer.wpe: embedding(P, D, positions=true)
  transformer.ln_f: layernorm(D, eps=1e-05)
  lm_head: head(V, tied=true)
  transformer.h: GPT2Block * 2
  embedded = transformer.wte(ids)
  positioned = embedded + transformer.wpe(ids)
  embedded_1 = dropout(positioned, p=0.1)
  layer_1 = transformer.h(embedded_1)
  normed = transformer.ln_f(layer_1)
  logits = lm_head(normed)
  return logits
}
"""
    compiled = blockir.compile(result.program, result.block, dims={"B": 2, "S": 5}, bind=result.bind)
    loaded = compiled.load_state_dict(model.state_dict(), strict=True)
    assert (loaded.missing_keys, loaded.unexpected_keys) == ([], [])
    assert compiled.lm_head.weight is compiled.get_parameter("transformer.wte.weight")


def test_gpt2_without_dropout_lifts_its_dropout_modules_at_p_0() -> None:
    model = _gpt2(embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
    result = blockir.lift(model, _ids())
    assert result.diagnostics == [] and result.max_error == 0.0, result.render()
    assert "  attn: self_attention(heads=4, causal=true, bias=true, out_bias=true, impl=eager, fused=stacked, " \
        "conv1d=true, qkv=c_attn, o=c_proj)\n" in result.text
    assert "  getitem = attn(layer_norm)\n" in result.text
    assert "  embedded_1 = dropout(positioned, p=0)\n" in result.text


def test_gpt2_with_sdpa_attention_has_its_dropout_read_from_the_kernel_call() -> None:
    result = blockir.lift(_gpt2("sdpa"), _ids())
    assert result.diagnostics == [] and result.max_error == 0.0, result.render()
    assert "  attn: self_attention(heads=4, causal=true, bias=true, out_bias=true, dropout=0.1, fused=stacked, " \
        "conv1d=true, qkv=c_attn, o=c_proj)\n" in result.text


def test_a_qwen2_causal_lm_lifts_as_one_model() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    result = blockir.lift(Qwen2ForCausalLM(config).eval(), _ids())
    assert result.diagnostics == [] and result.max_error == 0.0, result.render()
    assert "  self_attn: self_attention(heads=4, kv_heads=2, causal=true, rope=true, bias=true, impl=eager)\n" \
        in result.text
    assert "  model.layers: Qwen2DecoderLayer * 2\n" in result.text


def test_a_gpt_neox_causal_lm_lifts_with_its_per_head_fused_partial_rotary_attention() -> None:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           vocab_size=64, max_position_embeddings=64, rotary_pct=0.25)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    result = blockir.lift(GPTNeoXForCausalLM(config).eval(), _ids())
    assert result.diagnostics == [], result.render()
    assert result.max_error is not None and result.max_error <= 1e-6  # measured 3e-7: the parallel sum's order
    assert "  attention: self_attention(heads=4, causal=true, rope=true, rotary_dim=2, bias=true, out_bias=true, " \
        "impl=eager, fused=heads, qkv=query_key_value, o=dense)\n" in result.text
    assert "  embedded_1 = dropout(embedded, p=0)\n  layer_1 = gpt_neox.layers(embedded_1)\n" in result.text


def test_a_gemma_causal_lm_lifts_with_its_scaled_embedding() -> None:
    from transformers import GemmaConfig, GemmaForCausalLM

    config = GemmaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, vocab_size=64, max_position_embeddings=64)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    result = blockir.lift(GemmaForCausalLM(config).eval(), _ids())
    assert result.diagnostics == [] and result.max_error == 0.0, result.render()
    # sqrt(32) in f32, as the shortest decimal that multiplies the rows to the same numbers
    assert "  model.embed_tokens: embedding(V, D, padding_idx=0, scale=5.656854)\n" in result.text


class _Offset(torch.nn.Embedding):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) + 1


class _Shifted(torch.nn.Module):
    """A position table looked up from position 2: no ``embedding(P, D, positions=true)`` reads that."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(64, 32)
        self.wpe = torch.nn.Embedding(16, 32)
        self.layers = torch.nn.ModuleList([_Layer()])
        self.norm = torch.nn.LayerNorm(32)
        self.head = torch.nn.Linear(32, 64, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]) + 2)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(32)
        self.fc = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.ln(x))


def test_a_position_table_read_from_another_offset_is_e0913() -> None:
    (d,) = blockir.lift(_Shifted(), _ids()).diagnostics
    assert (d.code, d.message, d.span.filename) == (
        "E0913", "the position table 'wpe' is not read at the positions 0..S-1", __file__)


def test_an_embedding_that_returns_more_than_its_rows_is_e0913() -> None:
    model = _Shifted()
    model.wte = _Offset(64, 32)
    (d,) = blockir.lift(model, _ids()).diagnostics
    assert (d.code, d.message) == ("E0913", "the embedding 'wte' returns something other than its table's rows, "
                                            "or a constant times them")
