"""Writers for the GPT-2 and GPT-NeoX lines and the decoders built like them: LayerNorms, learned or rotary
positions, sequential or parallel updates (GPT-2, GPT-NeoX, Persimmon, StarCoder2, StableLM, Phi, Cohere).
"""
from __future__ import annotations

from blockir.importers.hf.text import (Config, Norm, attn_opts, causal_lm, decl, drop, fail, header,
                                       no_embedding_dropout, num, padding, window)
from blockir.importers.hf.writer import writes

# Cohere's LayerNorm: no bias, the variance from a second pass over the centred row (also Cohere 2's)
COHERE_NORM = Norm("layernorm", "layer_norm_eps", ("bias=false", "two_pass=true", "recenter=true"))


@writes("gpt2", norm=Norm("layernorm", "layer_norm_epsilon"))
def _gpt2(c: Config, model_type: str, exact: bool) -> str:
    cls, layer = "GPT2LMHeadModel", "GPT2Block"
    d = c.get("n_embd", c.get("hidden_size"))
    c.raw.setdefault("hidden_size", d)
    c.raw["num_attention_heads"] = c.get("n_head", c.get("num_attention_heads"))
    norm = c.norm()
    attn = attn_opts(c, exact, rotary=False) + ["bias=true", "out_bias=true", "fused=stacked", "conv1d=true",
                                                 "qkv=c_attn", "o=c_proj", "softmax_f32=false"]
    if not c.get("scale_attn_weights", True):
        attn.append("scale=1")
    mlp = ["F", f"act={c.act('activation_function', 'gelu_new')}", "fc1=c_fc", "fc2=c_proj", "conv1d=true"]
    p, e = c.get("resid_pdrop", 0.1), c.get("embd_pdrop", 0.1)
    lines = header(cls, model_type, c, {"D": d, "F": c.get("n_inner") or 4 * d, "P": c.get("n_positions", 1024),
                                         "L": c.get("n_layer", c.get("num_hidden_layers"))})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  ln_1: {norm}", decl("attn", "self_attention", attn),
              f"  ln_2: {norm}", decl("mlp", "mlp", mlp),
              f"  h = x + dropout(attn(ln_1(x)), p={num(p)})", f"  y = h + dropout(mlp(ln_2(h)), p={num(p)})",
              "  return y", "}", "",
              f"model {cls}(input_ids: [B, S]) -> [B, S, V] {{",
              "  transformer.wte: embedding(V, D)", "  transformer.wpe: embedding(P, D, positions=true)",
              f"  transformer.h: {layer} * L", f"  transformer.ln_f: {norm}",
              decl("lm_head", "head", ["V"] + (["tied=true"] if c.get("tie_word_embeddings", True) else [])),
              f"  # embd_pdrop={num(e)} (dropout on the sum of the two lookups while training) is not written:",
              "  # the verifiers read that sum as a residual add. Evaluation is unaffected.",
              "  x = transformer.wte(input_ids) + transformer.wpe(input_ids)",
              "  return lm_head(transformer.ln_f(transformer.h(x)))", "}"]
    return "\n".join(lines) + "\n"


@writes("gpt_neox", norm=Norm("layernorm", "layer_norm_eps"))
def _gpt_neox(c: Config, model_type: str, exact: bool) -> str:
    cls, layer = "GPTNeoXForCausalLM", "GPTNeoXLayer"
    norm = c.norm()
    attn = attn_opts(c, exact, partial=True) + ["bias=true", "out_bias=true", "fused=heads", "qkv=query_key_value",
                                                 "o=dense"]
    if not c.get("attention_bias", True):
        attn = [a for a in attn if not a.startswith(("bias", "out_bias"))]
    mlp = ["F", f"act={c.act(default='gelu')}", "fc1=dense_h_to_4h", "fc2=dense_4h_to_h"]
    lines = header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    # HF's op order and summation order: the first fixes how autograd accumulates x's gradient
    dropped = drop(c.get("hidden_dropout", 0.0))  # HF's post_attention_dropout and post_mlp_dropout
    update = ([f"  a = {dropped('attention(input_layernorm(x))')}", f"  m = {dropped('mlp(post_attention_layernorm(x))')}",
               "  y = m + a + x"] if c.get("use_parallel_residual", True) else
              [f"  h = x + {dropped('attention(input_layernorm(x))')}", f"  y = h + {dropped('mlp(post_attention_layernorm(h))')}"])
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  input_layernorm: {norm}", f"  post_attention_layernorm: {norm}",
              decl("attention", "self_attention", attn), decl("mlp", "mlp", mlp), *update, "  return y", "}", "",
              f"model {cls}(input_ids: [B, S]) -> [B, S, V] {{",
              "  gpt_neox.embed_in: embedding(V, D)", f"  gpt_neox.layers: {layer} * L",
              f"  gpt_neox.final_layer_norm: {norm}",
              decl("lm_head", "head", ["V"] + (["tied=true"] if c.get("tie_word_embeddings", False) else [])),
              "  return lm_head(gpt_neox.final_layer_norm(gpt_neox.layers(gpt_neox.embed_in(input_ids))))", "}"]
    return "\n".join(lines) + "\n"


def qk_layernorms(c: Config, default: bool = False) -> list[str]:
    """``qk_layernorm``: one LayerNorm over the head width for all query heads, one for all key heads."""
    if not c.get("qk_layernorm", default):
        return []
    return ["qk_norm=layernorm", f"qk_norm_eps={num(c.get('layer_norm_eps', 1e-5))}", "q_norm=q_layernorm",
            "k_norm=k_layernorm"]


@writes("persimmon", norm=Norm("layernorm", "layer_norm_eps"))
def _persimmon(c: Config, model_type: str, exact: bool) -> str:
    """Persimmon: GPT-NeoX's per-head fused attention with per-head q/k LayerNorms in LLaMA's sequential layer."""
    cls, layer = "PersimmonForCausalLM", "PersimmonDecoderLayer"
    width, heads = c.need("hidden_size"), c.need("num_attention_heads")
    if c.get("head_dim", width // heads) != width // heads:  # HF's attention splits the width, its RoPE reads this
        raise fail(f"head_dim={c.get('head_dim')} other than hidden_size // num_attention_heads is not supported",
                   at=("head_dim",))
    norm = c.norm()
    attn = attn_opts(c, exact, partial=True) + ["bias=true", "out_bias=true", "fused=heads", "qkv=query_key_value",
                                                 "o=dense"]
    attn += qk_layernorms(c, True)
    mlp = ["F", f"act={c.act(default='relu2')}", "fc1=dense_h_to_4h", "fc2=dense_4h_to_h"]
    update = drop(c.get("hidden_dropout", 0.0))  # on the MLP's output only
    # the attention's update is not dropped: with the MLP's dropped, p=0 says so
    attn_update = "self_attn(input_layernorm(x))"
    attn_update = f"dropout({attn_update}, p=0)" if c.get("hidden_dropout", 0.0) else attn_update
    lines = header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  input_layernorm: {norm}", decl("self_attn", "self_attention", attn),
              f"  post_attention_layernorm: {norm}", decl("mlp", "mlp", mlp),
              f"  h = x + {attn_update}",
              f"  y = h + {update('mlp(post_attention_layernorm(h))')}",
              "  return y", "}", ""]
    model = [line.replace("model.norm", "model.final_layernorm") for line in causal_lm(cls, "model", layer, c)]
    return "\n".join(lines + model) + "\n"


@writes("starcoder2", norm=Norm("layernorm", "norm_epsilon"))
def _starcoder2(c: Config, model_type: str, exact: bool) -> str:
    cls, layer = "Starcoder2ForCausalLM", "Starcoder2DecoderLayer"
    norm = c.norm()
    bias = ["bias=true", "out_bias=true"] if c.get("use_bias", True) else []
    attn = attn_opts(c, exact) + window(c) + bias
    mlp = ["F", f"act={c.act(default='gelu_pytorch_tanh')}", "fc1=c_fc", "fc2=c_proj"] + \
        ([] if c.get("use_bias", True) else ["bias=false"])
    update = drop(c.get("residual_dropout", 0.0))
    lines = header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  input_layernorm: {norm}", decl("self_attn", "self_attention", attn),
              f"  post_attention_layernorm: {norm}", decl("mlp", "mlp", mlp),
              f"  h = x + {update('self_attn(input_layernorm(x))')}", f"  y = h + {update('mlp(post_attention_layernorm(h))')}",
              "  return y", "}", ""]
    model = causal_lm(cls, "model", layer, c)
    no_embedding_dropout(c, "embedding_dropout")
    return "\n".join(lines + model) + "\n"


@writes("stablelm", norm=Norm("layernorm", "layer_norm_eps"))
def _stablelm(c: Config, model_type: str, exact: bool) -> str:
    cls, layer = "StableLmForCausalLM", "StableLmDecoderLayer"
    norm = c.norm()
    attn = attn_opts(c, exact, partial=True) + (["bias=true"] if c.get("use_qkv_bias", False) else [])
    update = drop(c.get("hidden_dropout", 0.0))
    # StableLM drops the MLP update only; where it also drops attention probabilities, p=0 on the attention
    # update says the missing residual dropout is the architecture's, not a confusion of the two settings
    kept = (lambda e: f"dropout({e}, p=0)") if c.get("hidden_dropout", 0.0) and c.get("attention_dropout", 0.0) \
        else (lambda e: e)
    lines = header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{", f"  input_layernorm: {norm}",
              decl("self_attn", "self_attention", attn), decl("mlp", "gated_mlp", ["F", f"act={c.act()}"])]
    if c.get("use_parallel_residual", False):  # one norm feeds both branches; HF runs attention first
        lines += ["  n = input_layernorm(x)", f"  a = {kept('self_attn(n)')}", f"  m = {update('mlp(n)')}",
                  "  y = x + a + m"]
    else:
        lines += [f"  post_attention_layernorm: {norm}", f"  h = x + {kept('self_attn(input_layernorm(x))')}",
                  f"  y = h + {update('mlp(post_attention_layernorm(h))')}"]
    lines += ["  return y", "}", ""]
    return "\n".join(lines + causal_lm(cls, "model", layer, c)) + "\n"


@writes("phi", norm=Norm("layernorm", "layer_norm_eps"))
def _phi(c: Config, model_type: str, exact: bool) -> str:
    cls, layer = "PhiForCausalLM", "PhiDecoderLayer"
    norm = c.norm()
    attn = attn_opts(c, exact, partial=True) + ["bias=true", "out_bias=true", "o=dense"] + qk_layernorms(c)
    update = drop(c.get("resid_pdrop", 0.0))
    lines = header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{", f"  input_layernorm: {norm}",
              decl("self_attn", "self_attention", attn), decl("mlp", "mlp", ["F", f"act={c.act(default='gelu_new')}"]),
              "  n = input_layernorm(x)", f"  a = {update('self_attn(n)')}", f"  m = {update('mlp(n)')}", "  y = a + m + x",
              "  return y", "}", "",
              f"model {cls}(input_ids: [B, S]) -> [B, S, V] {{",
              decl("model.embed_tokens", "embedding", ["V", "D"] + padding(c)), f"  model.layers: {layer} * L",
              f"  model.final_layernorm: {norm}",
              decl("lm_head", "head", ["V", "bias=true"] + (["tied=true"] if c.get("tie_word_embeddings") else [])),
              "  x = " + no_embedding_dropout(c, "embd_pdrop") + "model.embed_tokens(input_ids)",
              "  return lm_head(model.final_layernorm(model.layers(x)))", "}"]
    return "\n".join(lines) + "\n"


@writes("cohere", norm=COHERE_NORM)
def _cohere(c: Config, model_type: str, exact: bool) -> str:
    cls, layer = "CohereForCausalLM", "CohereDecoderLayer"
    norm = c.norm()
    attn = attn_opts(c, exact) + ["rope_style=interleaved", "rope_f32=true", "rope_tables=input"] + \
        (["bias=true", "out_bias=true"] if c.get("attention_bias", False) else [])
    lines = header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{", f"  input_layernorm: {norm}",
              decl("self_attn", "self_attention", attn), decl("mlp", "gated_mlp", ["F", f"act={c.act()}"]),
              "  n = input_layernorm(x)", "  a = self_attn(n)", "  m = mlp(n)", "  y = x + a + m",
              "  return y", "}", ""]
    model = causal_lm(cls, "model", layer, c)
    model[-2] = f"  return {num(c.get('logit_scale', 0.0625))} * lm_head(model.norm(model.layers(model.embed_tokens(input_ids))))"
    return "\n".join(lines + model) + "\n"
