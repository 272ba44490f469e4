"""Writers for encoder and learned-position model types: a transformers config → its `.block` text.

Encoders are written as their ``*Model`` class without the pooler, returning the last hidden
state ``[B, S, D]``; the pooler (a tanh dense on the first token that only classification heads
read) is left out, so a checkpoint's ``pooler.*`` keys are not part of the file.
"""
from __future__ import annotations

from typing import Callable

from blockir.importers import hf
from blockir.importers.hf import ACTS, _Config, _decl, _fail, _num

ENCODERS = {"bert": ("BertModel", "BertLayer", "bert"), "roberta": ("RobertaModel", "RobertaLayer", "roberta"),
            "xlm-roberta": ("XLMRobertaModel", "XLMRobertaLayer", "roberta"),
            "camembert": ("CamembertModel", "CamembertLayer", "roberta"),
            "electra": ("ElectraModel", "ElectraLayer", "bert")}


def _dims(cls: str, model_type: str, dims: dict[str, int], layers: int) -> list[str]:
    roles = {"D": "model", "V": "vocab", "P": "vocab", "T": "vocab", "E": "model"}
    return [f"# {cls} (transformers model_type '{model_type}'), written by `blockir import hf` from its config.",
            "# Declaration names are the HF attribute names: the real state dict loads with strict=True.", "",
            "dim B: batch", "dim S: seq", *[f"dim {k}: {roles.get(k, 'hidden')} = {v}" for k, v in dims.items()],
            f"const L = {layers}", ""]


def _act(c: _Config, key: str, default: str) -> str:
    name = c.get(key, default)
    if name not in ACTS:
        raise _fail(f"activation '{name}' is not supported", "supported: " + ", ".join(sorted(ACTS)))
    return ACTS[name]


def _attention(c: _Config, heads: int, exact: bool, **names: str) -> list[str]:
    opts = [f"heads={heads}", "causal=false", "bias=true", "out_bias=true", "softmax_f32=false"]
    opts += [f"{role}={name}" for role, name in names.items()]
    p = c.get("attention_probs_dropout_prob", c.get("attention_dropout", 0.0))
    if p:
        opts.append(f"dropout={_num(p)}")
    return opts + (["impl=eager"] if exact else [])


def _encoder(c: _Config, model_type: str, exact: bool) -> str:
    """BERT's Post-LN encoder; RoBERTa-style types differ only in their position offset."""
    cls, layer, style = ENCODERS[model_type]
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise _fail(f"position_embedding_type '{c.get('position_embedding_type')}' is not supported",
                    "supported: absolute")
    d, e = c.need("hidden_size"), c.get("embedding_size", c.need("hidden_size"))
    eps, p = _num(c.get("layer_norm_eps", 1e-12)), _num(c.get("hidden_dropout_prob", 0.1))
    dims = {"D": d, "E": e, "F": c.need("intermediate_size"), "V": c.need("vocab_size"),
            "P": c.get("max_position_embeddings", 512), "T": c.get("type_vocab_size", 2)}
    if e == d:
        del dims["E"]
    width = "E" if e != d else "D"
    offset = c.get("pad_token_id", 1) + 1 if style == "roberta" else 0
    attn = _attention(c, c.need("num_attention_heads"), exact, q="self.query", k="self.key", v="self.value",
                      o="output.dense")
    lines = _dims(cls, model_type, dims, c.need("num_hidden_layers"))
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              _decl("attention", "self_attention", attn),
              f"  attention.output.LayerNorm: layernorm(D, eps={eps})",
              "  intermediate.dense: linear(D, F)", "  output.dense: linear(F, D)",
              f"  output.LayerNorm: layernorm(D, eps={eps})",
              f"  h = attention.output.LayerNorm(dropout(attention(x), p={p}) + x)",
              f"  i = {_act(c, 'hidden_act', 'gelu')}(intermediate.dense(h))",
              f"  y = output.LayerNorm(dropout(output.dense(i), p={p}) + h)",
              "  return y", "}", "",
              f"model {cls}(input_ids: [B, S], token_type_ids: [B, S]) -> [B, S, D] {{",
              f"  embeddings.word_embeddings: embedding(V, {width})",
              f"  embeddings.token_type_embeddings: embedding(T, {width})",
              _decl("embeddings.position_embeddings", "embedding",
                    ["P", width, "positions=true"] + ([f"position_offset={offset}"] if offset else [])),
              f"  embeddings.LayerNorm: layernorm({width}, eps={eps})"]
    project = "embeddings_project(e)" if e != d else "e"
    if e != d:
        lines.append(f"  embeddings_project: linear({width}, D)")
    lines += [f"  encoder.layer: {layer} * L",
              "  w = embeddings.word_embeddings(input_ids) + embeddings.token_type_embeddings(token_type_ids)",
              "  s = w + embeddings.position_embeddings(input_ids)",
              f"  # the embeddings' dropout (p={p} while training) is not written: the verifiers read the sum of",
              "  # the lookups as a residual add. Evaluation is unaffected.",
              "  e = embeddings.LayerNorm(s)",
              f"  return encoder.layer({project})", "}"]
    return "\n".join(lines) + "\n"


def _distilbert(c: _Config, model_type: str, exact: bool) -> str:
    """DistilBERT: BERT without token types, its attention's output projection inside the attention."""
    cls, layer = "DistilBertModel", "TransformerBlock"
    if c.get("sinusoidal_pos_embds", False):
        raise _fail("DistilBERT's frozen sinusoidal position table (sinusoidal_pos_embds) is not supported",
                    "set sinusoidal_pos_embds to false: the table is then learned")
    d, p = c.need("dim"), _num(c.get("dropout", 0.1))
    attn = _attention(c, c.need("n_heads"), exact, q="q_lin", k="k_lin", v="v_lin", o="out_lin")
    lines = _dims(cls, model_type, {"D": d, "F": c.need("hidden_dim"), "V": c.need("vocab_size"),
                                    "P": c.get("max_position_embeddings", 512)}, c.need("n_layers"))
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              _decl("attention", "self_attention", attn), "  sa_layer_norm: layernorm(D, eps=1e-12)",
              _decl("ffn", "mlp", ["F", f"act={_act(c, 'activation', 'gelu')}", "fc1=lin1", "fc2=lin2"]),
              "  output_layer_norm: layernorm(D, eps=1e-12)",
              "  h = sa_layer_norm(attention(x) + x)",
              f"  y = output_layer_norm(dropout(ffn(h), p={p}) + h)",
              "  return y", "}", "",
              f"model {cls}(input_ids: [B, S]) -> [B, S, D] {{",
              "  embeddings.word_embeddings: embedding(V, D)",
              "  embeddings.position_embeddings: embedding(P, D, positions=true)",
              "  embeddings.LayerNorm: layernorm(D, eps=1e-12)", f"  transformer.layer: {layer} * L",
              f"  # the embeddings' dropout (p={p} while training) is not written, as for BERT.",
              "  s = embeddings.word_embeddings(input_ids) + embeddings.position_embeddings(input_ids)",
              "  return transformer.layer(embeddings.LayerNorm(s))", "}"]
    return "\n".join(lines) + "\n"


WRITERS: dict[str, Callable[[_Config, str, bool], str]] = {**{t: _encoder for t in ENCODERS},
                                                           "distilbert": _distilbert}
hf.WRITERS.update(WRITERS)
