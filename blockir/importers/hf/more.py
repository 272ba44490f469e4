"""Writers for encoder and learned-position model types: a transformers config → its `.block` text.

Encoders are written as their ``*Model`` class without the pooler, returning the last hidden
state ``[B, S, D]``; the pooler (a tanh dense on the first token that only classification heads
read) is left out, so a checkpoint's ``pooler.*`` keys are not part of the file. Where ``architectures``
names the masked LM, the file is that class: the encoder under its attribute name and the head
(dense, activation, norm, vocabulary projection) that HF's masked-LM class stacks on it.
"""
from __future__ import annotations

from dataclasses import dataclass

from blockir.importers.hf.text import Config, Norm, attn_opts, decl, exact_impl, fail, num
from blockir.importers.hf.versions import transformers_at_least
from blockir.importers.hf.writer import writes

SHARED_ATTENTION = (5, 25)  # the transformers release that moved Falcon onto the shared attention functions

ENCODERS = {"bert": ("BertModel", "BertLayer", "bert"), "roberta": ("RobertaModel", "RobertaLayer", "roberta"),
            "xlm-roberta": ("XLMRobertaModel", "XLMRobertaLayer", "roberta"),
            "camembert": ("CamembertModel", "CamembertLayer", "roberta"),
            "electra": ("ElectraModel", "ElectraLayer", "bert")}


@dataclass(frozen=True)
class MaskedHead:
    """A masked-LM class: the attribute its encoder sits under and its head's layers, as HF names them."""

    cls: str
    encoder: str
    dense: str
    norm: str
    decoder: str
    bias: str | None = None  # the vector HF registers beside the decoder as well, one tensor with the decoder's bias
    act: str | None = None  # the config field naming the activation; unset: gelu, fixed by HF's code


_ROBERTA = dict(encoder="roberta", dense="lm_head.dense", norm="lm_head.layer_norm", decoder="lm_head.decoder",
                bias="lm_head.bias")
MASKED = {"bert": MaskedHead("BertForMaskedLM", "bert", "cls.predictions.transform.dense",
                             "cls.predictions.transform.LayerNorm", "cls.predictions.decoder", "cls.predictions.bias",
                             act="hidden_act"),
          "roberta": MaskedHead("RobertaForMaskedLM", **_ROBERTA),
          "xlm-roberta": MaskedHead("XLMRobertaForMaskedLM", **_ROBERTA),
          "camembert": MaskedHead("CamembertForMaskedLM", **_ROBERTA),
          "electra": MaskedHead("ElectraForMaskedLM", "electra", "generator_predictions.dense",
                                "generator_predictions.LayerNorm", "generator_lm_head"),
          "distilbert": MaskedHead("DistilBertForMaskedLM", "distilbert", "vocab_transform", "vocab_layer_norm",
                                   "vocab_projector", act="activation")}


def _masked(c: Config, model_type: str) -> MaskedHead | None:
    """The masked-LM head to write, where ``architectures`` names that class."""
    head = MASKED[model_type]
    return head if (c.get("architectures") or [None])[0] == head.cls else None


def _head_lines(c: Config, head: MaskedHead, hidden: str, width: str) -> list[str]:
    """The masked-LM head on the encoder's output ``hidden``: dense D → ``width``, activation, norm, decoder."""
    tied = bool(c.get("tie_word_embeddings", True))
    # HF ties the decoder's bias to the head's vector together with the embedding; untied, the vector is unused
    shared = [f"shared_bias={head.bias}"] if head.bias and tied else []
    act = c.act(head.act, "gelu") if head.act else "gelu"
    lines = [f"  {head.dense}: linear(D, {width})", f"  {head.norm}: {c.norm(width)}"]
    lines += [f"  {head.bias}: bias(V)"] if head.bias else []
    lines += [decl(head.decoder, "head", ["V", "bias=true"] + (["tied=true"] if tied else []) + shared),
              f"  t = {head.norm}({act}({head.dense}({hidden})))", f"  return {head.decoder}(t)"]
    return lines


def _dims(cls: str, model_type: str, dims: dict[str, int], layers: int) -> list[str]:
    roles = {"D": "model", "V": "vocab", "P": "vocab", "T": "vocab", "E": "model"}
    return [f"# {cls} (transformers model_type '{model_type}'), written by `blockir import hf` from its config.",
            "# Declaration names are the HF attribute names: the real state dict loads with strict=True.", "",
            "dim B: batch", "dim S: seq", *[f"dim {k}: {roles.get(k, 'hidden')} = {v}" for k, v in dims.items()],
            f"const L = {layers}", ""]


def _pad(c: Config) -> str:
    """The token table's ``padding_idx`` argument: HF builds it with the config's pad token, whose row gets no gradient."""
    pad = c.get("pad_token_id")
    return f", padding_idx={pad}" if pad is not None else ""


def _attention(c: Config, heads: int, exact: bool, **names: str) -> list[str]:
    opts = [f"heads={heads}", "causal=false", "bias=true", "out_bias=true", "softmax_f32=false"]
    opts += [f"{role}={name}" for role, name in names.items()]
    p = c.get("attention_probs_dropout_prob", c.get("attention_dropout", 0.0))
    if p:
        opts.append(f"dropout={num(p)}")
    return opts + (exact_impl(c, cached=False) if exact else [])


@writes(*ENCODERS, norm=Norm("layernorm", "layer_norm_eps"))
def _encoder(c: Config, model_type: str, exact: bool) -> str:
    """BERT's Post-LN encoder; RoBERTa-style types differ only in their position offset."""
    cls, layer, style = ENCODERS[model_type]
    head = _masked(c, model_type)
    cls, pre, out = (head.cls, head.encoder + ".", "V") if head else (cls, "", "D")
    d, e = c.need("hidden_size"), c.get("embedding_size", c.need("hidden_size"))
    p = num(c.get("hidden_dropout_prob", 0.1))
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
              decl("attention", "self_attention", attn),
              f"  attention.output.LayerNorm: {c.norm()}",
              "  intermediate.dense: linear(D, F)", "  output.dense: linear(F, D)",
              f"  output.LayerNorm: {c.norm()}",
              f"  h = attention.output.LayerNorm(dropout(attention(x), p={p}) + x)",
              f"  i = {c.act('hidden_act', 'gelu')}(intermediate.dense(h))",
              f"  y = output.LayerNorm(dropout(output.dense(i), p={p}) + h)",
              "  return y", "}", "",
              f"model {cls}(input_ids: [B, S], token_type_ids: [B, S]) -> [B, S, {out}] {{",
              f"  {pre}embeddings.word_embeddings: embedding(V, {width}{_pad(c)})",
              f"  {pre}embeddings.token_type_embeddings: embedding(T, {width})",
              decl(f"{pre}embeddings.position_embeddings", "embedding",
                    ["P", width, "positions=true"] + ([f"position_offset={offset}"] if offset else [])),
              f"  {pre}embeddings.LayerNorm: {c.norm(width)}"]
    project = f"{pre}embeddings_project(e)" if e != d else "e"
    if e != d:
        lines.append(f"  {pre}embeddings_project: linear({width}, D)")
    lines += [f"  {pre}encoder.layer: {layer} * L",
              f"  w = {pre}embeddings.word_embeddings(input_ids) + {pre}embeddings.token_type_embeddings(token_type_ids)",
              f"  s = w + {pre}embeddings.position_embeddings(input_ids)",
              f"  # the embeddings' dropout (p={p} while training) is not written: the verifiers read the sum of",
              "  # the lookups as a residual add. Evaluation is unaffected.",
              f"  e = {pre}embeddings.LayerNorm(s)"]
    final = f"{pre}encoder.layer({project})"
    lines += _head_lines(c, head, final, width) if head else [f"  return {final}"]
    return "\n".join(lines + ["}"]) + "\n"


@writes("distilbert", norm=Norm("layernorm", 1e-12))
def _distilbert(c: Config, model_type: str, exact: bool) -> str:
    """DistilBERT: BERT without token types, its attention's output projection inside the attention."""
    head = _masked(c, model_type)
    cls, layer = head.cls if head else "DistilBertModel", "TransformerBlock"
    pre, out = ("distilbert.", "V") if head else ("", "D")
    d, p = c.need("dim"), num(c.get("dropout", 0.1))
    attn = _attention(c, c.need("n_heads"), exact, q="q_lin", k="k_lin", v="v_lin", o="out_lin")
    # DistilBERT drops the FFN update only: p=0 on the attention update says so beside its probabilities' dropout
    update = "dropout(attention(x), p=0)" if c.get("attention_dropout", 0.0) else "attention(x)"
    lines = _dims(cls, model_type, {"D": d, "F": c.need("hidden_dim"), "V": c.need("vocab_size"),
                                    "P": c.get("max_position_embeddings", 512)}, c.need("n_layers"))
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              decl("attention", "self_attention", attn), f"  sa_layer_norm: {c.norm()}",
              decl("ffn", "mlp", ["F", f"act={c.act('activation', 'gelu')}", "fc1=lin1", "fc2=lin2"]),
              f"  output_layer_norm: {c.norm()}",
              f"  h = sa_layer_norm({update} + x)",
              f"  y = output_layer_norm(dropout(ffn(h), p={p}) + h)",
              "  return y", "}", "",
              f"model {cls}(input_ids: [B, S]) -> [B, S, {out}] {{",
              f"  {pre}embeddings.word_embeddings: embedding(V, D{_pad(c)})",
              f"  {pre}embeddings.position_embeddings: embedding(P, D, positions=true)",
              f"  {pre}embeddings.LayerNorm: {c.norm()}", f"  {pre}transformer.layer: {layer} * L",
              f"  # the embeddings' dropout (p={p} while training) is not written, as for BERT.",
              f"  s = {pre}embeddings.word_embeddings(input_ids) + {pre}embeddings.position_embeddings(input_ids)"]
    final = f"{pre}transformer.layer({pre}embeddings.LayerNorm(s))"
    lines += _head_lines(c, head, final, "D") if head else [f"  return {final}"]
    return "\n".join(lines + ["}"]) + "\n"


def _causal_attention(c: Config, exact: bool, bias: bool, *extra: str) -> list[str]:
    """OPT-style attention: q/k/v/out_proj, queries scaled right after their projection."""
    opts = [f"heads={c.need('num_attention_heads')}", "scale_query=true", *extra]
    opts += ["bias=true", "out_bias=true"] if bias else []
    p = c.get("attention_dropout", 0.0)
    return opts + ([f"dropout={num(p)}"] if p else []) + (exact_impl(c, cached=True) if exact else [])


def _post_or_pre(pre: bool, p: str, attn_norm: str, mlp_norm: str, mlp: str) -> list[str]:
    """The two residual updates of an OPT-style layer, Pre-LN or Post-LN."""
    if pre:
        return [f"  h = x + dropout(self_attn({attn_norm}(x)), p={p})",
                f"  y = h + dropout({mlp.format(f'{mlp_norm}(h)')}, p={p})"]
    return [f"  h = {attn_norm}(x + dropout(self_attn(x), p={p}))",
            f"  y = {mlp_norm}(h + dropout({mlp.format('h')}, p={p}))"]


@writes("opt", norm=Norm("layernorm", affine="layer_norm_elementwise_affine"))
def _opt(c: Config, model_type: str, exact: bool) -> str:
    """OPT: learned positions numbered over the kept tokens from row 2, Pre- or Post-LN by do_layer_norm_before."""
    cls, layer = "OPTForCausalLM", "OPTDecoderLayer"
    d, w = c.need("hidden_size"), c.get("word_embed_proj_dim", c.need("hidden_size"))
    pre, bias = c.get("do_layer_norm_before", True), c.get("enable_bias", True)
    final = pre and not c.get("_remove_final_layer_norm", False)
    norm = c.norm()
    p, act = num(c.get("dropout", 0.1)), c.act("activation_function", "relu")
    dims = {"D": d, "W": w, "F": c.need("ffn_dim"), "V": c.need("vocab_size"),
            "P": c.get("max_position_embeddings", 2048) + 2}
    if w == d:
        del dims["W"]
    lines = _dims(cls, model_type, dims, c.need("num_hidden_layers"))
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  self_attn_layer_norm: {norm}", decl("self_attn", "self_attention", _causal_attention(c, exact, bias,
                                                                                                   "o=out_proj")),
              f"  final_layer_norm: {norm}", f"  fc1: linear(D, F, bias={str(bias).lower()})",
              f"  fc2: linear(F, D, bias={str(bias).lower()})",
              *_post_or_pre(pre, p, "self_attn_layer_norm", "final_layer_norm", f"fc2({act}(fc1({{}})))"),
              "  return y", "}", "",
              f"model {cls}(input_ids: [B, S]) -> [B, S, V] {{",
              f"  model.decoder.embed_tokens: embedding(V, {'W' if w != d else 'D'}{_pad(c)})",
              "  model.decoder.embed_positions: embedding(P, D, positions=true, position_offset=2, mask_positions=true)"]
    tokens, out = "model.decoder.embed_tokens(input_ids)", "model.decoder.layers(x)"
    if w != d:
        lines += ["  model.decoder.project_in: linear(W, D, bias=false)",
                  "  model.decoder.project_out: linear(D, W, bias=false)"]
        tokens = f"model.decoder.project_in({tokens})"
    if final:
        lines.append(f"  model.decoder.final_layer_norm: {norm}")
        out = f"model.decoder.final_layer_norm({out})"
    if w != d:
        out = f"model.decoder.project_out({out})"
    tied = ["tied=true"] if c.get("tie_word_embeddings", True) else []
    lines += [f"  model.decoder.layers: {layer} * L", decl("lm_head", "head", ["V", *tied]),
              f"  x = {tokens} + model.decoder.embed_positions(input_ids)",
              f"  return lm_head({out})", "}"]
    return "\n".join(lines) + "\n"


@writes("bloom", norm=Norm("layernorm", "layer_norm_epsilon"))
def _bloom(c: Config, model_type: str, exact: bool) -> str:
    """BLOOM: ALiBi, per-head fused query_key_value, a norm on the embeddings, Pre-LN."""
    cls, layer = "BloomForCausalLM", "BloomBlock"
    d, heads = c.get("hidden_size", c.get("n_embed")), c.get("n_head", c.get("num_attention_heads"))
    p = num(c.get("hidden_dropout", 0.0))
    attn = [f"heads={heads}", "alibi=true", "bias=true", "out_bias=true", "fused=heads", "qkv=query_key_value",
            "o=dense"]
    if c.get("attention_dropout", 0.0):
        attn.append(f"dropout={num(c.get('attention_dropout'))}")
    attn += exact_impl(c, cached=True) if exact else []
    norm = c.norm()
    lines = _dims(cls, model_type, {"D": d, "F": 4 * d, "V": c.need("vocab_size")},
                  c.get("n_layer", c.get("num_hidden_layers")))
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  input_layernorm: {norm}", decl("self_attention", "self_attention", attn),
              f"  post_attention_layernorm: {norm}",
              decl("mlp", "mlp", ["F", "act=gelu_bloom", "fc1=dense_h_to_4h", "fc2=dense_4h_to_h"]),
              f"  h = x + dropout(self_attention(input_layernorm(x)), p={p})",
              f"  y = h + dropout(mlp(post_attention_layernorm(h)), p={p})",
              "  return y", "}", "",
              f"model {cls}(input_ids: [B, S]) -> [B, S, V] {{",
              "  transformer.word_embeddings: embedding(V, D)",
              f"  transformer.word_embeddings_layernorm: {norm}",
              f"  transformer.h: {layer} * L", f"  transformer.ln_f: {norm}",
              decl("lm_head", "head", ["V"] + (["tied=true"] if c.get("tie_word_embeddings", True) else [])),
              "  x = transformer.word_embeddings_layernorm(transformer.word_embeddings(input_ids))",
              "  return lm_head(transformer.ln_f(transformer.h(x)))", "}"]
    return "\n".join(lines) + "\n"


@writes("gpt_bigcode", norm=Norm("layernorm", "layer_norm_epsilon"))
def _gpt_bigcode(c: Config, model_type: str, exact: bool) -> str:
    """GPT-BigCode (StarCoder): GPT-2 with nn.Linear layers and multi-query attention in one fused c_attn."""
    cls, layer = "GPTBigCodeForCausalLM", "GPTBigCodeBlock"
    d, heads = c.get("n_embd", c.get("hidden_size")), c.get("n_head", c.get("num_attention_heads"))
    mqa = c.get("multi_query", True)
    norm, p = c.norm(), num(c.get("resid_pdrop", 0.1))
    attn = [f"heads={heads}"] + (["kv_heads=1", "fused=stacked"] if mqa else ["fused=heads"])
    attn += ["bias=true", "out_bias=true", "qkv=c_attn", "o=c_proj"]
    if not c.get("scale_attn_weights", True):
        attn.append("scale=1")
    if c.get("attn_pdrop", 0.1):
        attn.append(f"dropout={num(c.get('attn_pdrop', 0.1))}")
    attn += exact_impl(c, cached=True) if exact else []
    mlp = ["F", f"act={c.act('activation_function', 'gelu_pytorch_tanh')}", "fc1=c_fc", "fc2=c_proj"]
    lines = _dims(cls, model_type, {"D": d, "F": c.get("n_inner") or 4 * d, "V": c.need("vocab_size"),
                                    "P": c.get("n_positions", 1024)}, c.get("n_layer", c.get("num_hidden_layers")))
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  ln_1: {norm}", decl("attn", "self_attention", attn),
              f"  ln_2: {norm}", decl("mlp", "mlp", mlp),
              f"  h = x + dropout(attn(ln_1(x)), p={p})", f"  y = h + dropout(mlp(ln_2(h)), p={p})",
              "  return y", "}", "",
              f"model {cls}(input_ids: [B, S]) -> [B, S, V] {{",
              "  transformer.wte: embedding(V, D)", "  transformer.wpe: embedding(P, D, positions=true)",
              f"  transformer.h: {layer} * L", f"  transformer.ln_f: {norm}",
              decl("lm_head", "head", ["V"] + (["tied=true"] if c.get("tie_word_embeddings", True) else [])),
              f"  # embd_pdrop={num(c.get('embd_pdrop', 0.1))} on the sum of the lookups is not written, as for GPT-2.",
              "  x = transformer.wte(input_ids) + transformer.wpe(input_ids)",
              "  return lm_head(transformer.ln_f(transformer.h(x)))", "}"]
    return "\n".join(lines) + "\n"


@writes("biogpt", norm=Norm("layernorm"))
def _biogpt(c: Config, model_type: str, exact: bool) -> str:
    """BioGPT: Pre-LN, learned positions from row 2, token embeddings scaled by √D, tied output_projection."""
    cls, layer = "BioGptForCausalLM", "BioGptDecoderLayer"
    p, pa = num(c.get("hidden_dropout_prob", 0.1)), c.get("activation_dropout", 0.0)
    attn = [f"heads={c.need('num_attention_heads')}", "bias=true", "out_bias=true", "o=out_proj", "softmax_f32=false"]
    if c.get("attention_probs_dropout_prob", 0.1):
        attn.append(f"dropout={num(c.get('attention_probs_dropout_prob', 0.1))}")
    attn += exact_impl(c, cached=True) if exact else []
    act = f"{c.act('hidden_act', 'gelu')}(fc1({{}}))"
    mlp = f"fc2(dropout({act}, p={num(pa)}))" if pa else f"fc2({act})"
    scale = ", scale=D ** 0.5" if c.get("scale_embedding", True) else ""
    lines = _dims(cls, model_type, {"D": c.need("hidden_size"), "F": c.need("intermediate_size"),
                                    "V": c.need("vocab_size"), "P": c.get("max_position_embeddings", 1024) + 2},
                  c.need("num_hidden_layers"))
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  self_attn_layer_norm: {c.norm()}", decl("self_attn", "self_attention", attn),
              f"  final_layer_norm: {c.norm()}", "  fc1: linear(D, F)", "  fc2: linear(F, D)",
              *_post_or_pre(True, p, "self_attn_layer_norm", "final_layer_norm", mlp),
              "  return y", "}", "",
              f"model {cls}(input_ids: [B, S]) -> [B, S, V] {{",
              f"  biogpt.embed_tokens: embedding(V, D{_pad(c)}{scale})",
              "  biogpt.embed_positions: embedding(P, D, positions=true, position_offset=2)",
              f"  biogpt.layers: {layer} * L", f"  biogpt.layer_norm: {c.norm()}",
              decl("output_projection", "head", ["V"] + (["tied=true"] if c.get("tie_word_embeddings", True) else [])),
              f"  # the dropout on the sum of the lookups (p={p} while training) is not written, as for GPT-2.",
              "  x = biogpt.embed_tokens(input_ids) + biogpt.embed_positions(input_ids)",
              "  return output_projection(biogpt.layer_norm(biogpt.layers(x)))", "}"]
    return "\n".join(lines) + "\n"


@writes("falcon", norm=Norm("layernorm", "layer_norm_epsilon"))
def _falcon(c: Config, model_type: str, exact: bool) -> str:
    """Falcon: RoPE, fused query_key_value, parallel attention and MLP read from one or two norms."""
    cls, layer = "FalconForCausalLM", "FalconDecoderLayer"
    new, parallel = c.get("new_decoder_architecture", False), c.get("parallel_attn", True)
    heads = c.need("num_attention_heads")
    if new and not parallel:
        raise fail("Falcon's new_decoder_architecture without parallel_attn is not supported", at=("parallel_attn",))
    kv = c.get("num_kv_heads", heads) if new or not c.get("multi_query", True) else 1
    if kv not in (1, heads):
        raise fail(f"Falcon with {kv} key/value groups of {heads} heads is not supported",
                    "supported: one key/value head, or one per query head", at=("num_kv_heads",))
    # transformers 5.25 runs Falcon's attention through the shared attention functions: scores times the scale,
    # softmax in fp32, key/value heads repeated after the rotation, the attention dropout applied. Before it, the
    # class's own op divided the scores by sqrt(head_dim), took the softmax in the input's dtype, broadcast the
    # new architecture's one key/value head before rotating, and dropped nothing on the rotary path.
    shared = transformers_at_least(*SHARED_ATTENTION)
    c.raw.update(num_key_value_heads=kv, **({} if shared else {"attention_dropout": 0.0}))
    bias = ["bias=true", "out_bias=true"] if c.get("bias", False) else []
    attn = attn_opts(c, exact) + ["fused=" + ("stacked" if kv == 1 else "heads"), "qkv=query_key_value", "o=dense",
                                   *([] if shared else ["softmax_f32=false"]), *bias]
    if exact and not shared:
        attn += ["kv_broadcast=true"] if new and kv == 1 else []
        attn.append("divide_scores=true")
    p = num(c.get("hidden_dropout", 0.0))
    norm = c.norm()
    mlp = ["F", f"act={c.act('activation', 'gelu')}", "fc1=dense_h_to_4h", "fc2=dense_4h_to_h",
           f"bias={str(bool(c.get('bias', False))).lower()}"]
    d = c.need("hidden_size")
    lines = _dims(cls, model_type, {"D": d, "F": c.get("ffn_hidden_size") or 4 * d, "V": c.need("vocab_size")},
                  c.need("num_hidden_layers"))
    two = new and (c.get("num_ln_in_parallel_attn") or 2) == 2
    if not parallel:
        norms = ["input_layernorm", "post_attention_layernorm"]
        update = [f"  h = x + dropout(self_attention(input_layernorm(x)), p={num(c.get('attention_dropout', 0.0))})",
                  f"  y = h + dropout(mlp(post_attention_layernorm(h)), p={p})"]
    else:
        norms = ["ln_attn", "ln_mlp"] if two else ["input_layernorm"]
        # one norm output feeds both branches (its gradient is summed before the norm's backward, as in HF)
        update = ([f"  a = {norms[0]}(x)", f"  m = {norms[1]}(x)"] if two else [f"  a = {norms[0]}(x)"]) + \
            [f"  y = x + dropout(mlp({'m' if two else 'a'}) + self_attention(a), p={p})"]
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{", *[f"  {n}: {norm}" for n in norms],
              decl("self_attention", "self_attention", attn), decl("mlp", "mlp", mlp), *update,
              "  return y", "}", "",
              f"model {cls}(input_ids: [B, S]) -> [B, S, V] {{",
              "  transformer.word_embeddings: embedding(V, D)", f"  transformer.h: {layer} * L",
              f"  transformer.ln_f: {norm}",
              decl("lm_head", "head", ["V"] + (["tied=true"] if c.get("tie_word_embeddings", True) else [])),
              "  return lm_head(transformer.ln_f(transformer.h(transformer.word_embeddings(input_ids))))", "}"]
    return "\n".join(lines) + "\n"


@writes("gpt_neo", norm=Norm("layernorm", "layer_norm_epsilon"))
def _gpt_neo(c: Config, model_type: str, exact: bool) -> str:
    """GPT-Neo: unscaled scores, layers alternating global and local (windowed) attention, one block per kind."""
    cls, norm = "GPTNeoForCausalLM", c.norm()
    kinds = [k for pattern, n in c.need("attention_types") for _ in range(n) for k in pattern]
    p, d = num(c.get("resid_dropout", 0.0)), c.need("hidden_size")
    lines = _dims(cls, model_type, {"D": d, "F": c.get("intermediate_size") or 4 * d, "V": c.need("vocab_size"),
                                    "P": c.get("max_position_embeddings", 2048)}, c.need("num_layers"))
    for kind in sorted(set(kinds)):
        attn = [f"heads={c.need('num_heads')}", "out_bias=true", "o=out_proj", "scale=1"]
        attn += [f"window={c.need('window_size')}"] if kind == "local" else []
        if c.get("attention_dropout", 0.0):
            attn.append(f"dropout={num(c.get('attention_dropout'))}")
        attn += exact_impl(c, cached=True) + ["scores_f32=true"] if exact else []
        lines += [f"block GPTNeoBlock_{kind}(x: [B, S, D]) -> [B, S, D] {{",
                  f"  ln_1: {norm}", decl("attn.attention", "self_attention", attn),
                  f"  ln_2: {norm}",
                  decl("mlp", "mlp", ["F", f"act={c.act('activation_function', 'gelu_new')}", "fc1=c_fc",
                                       "fc2=c_proj"]),
                  f"  h = x + dropout(attn.attention(ln_1(x)), p={p})", f"  y = h + dropout(mlp(ln_2(h)), p={p})",
                  "  return y", "}", ""]
    lines += [f"model {cls}(input_ids: [B, S]) -> [B, S, V] {{",
              "  transformer.wte: embedding(V, D)", "  transformer.wpe: embedding(P, D, positions=true)",
              *[f"  transformer.h.{i}: GPTNeoBlock_{k}" for i, k in enumerate(kinds)],
              f"  transformer.ln_f: {norm}",
              decl("lm_head", "head", ["V"] + (["tied=true"] if c.get("tie_word_embeddings", True) else [])),
              f"  # embed_dropout={num(c.get('embed_dropout', 0.0))} on the sum of the lookups is not written.",
              "  x0 = transformer.wte(input_ids) + transformer.wpe(input_ids)",
              *[f"  x{i + 1} = transformer.h.{i}(x{i})" for i in range(len(kinds))],
              f"  return lm_head(transformer.ln_f(x{len(kinds)}))", "}"]
    return "\n".join(lines) + "\n"

