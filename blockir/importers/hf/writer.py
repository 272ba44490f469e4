"""A transformers config (dict or JSON) → the `.block` text of the class its ``architectures`` names.

Names equal the HF classes' attribute names, so the compiled model loads the real state dict
strictly; dims, norms, eps, placement and attention options come from the config fields, which
``hf_config.read_fields`` checks against the family's table first. Only ``json`` is imported: a
config object is read through its ``to_dict()``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from blockir.diagnostics import BlockError, json_span
from blockir.diagnostics import error as _error
from blockir.importers.hf.family import ACTS

ROPE_SCALINGS = ("default", "linear", "llama3", "yarn")
# rope_parameters key -> the attention argument that states it
ROPE_ARGS = {"factor": "rope_factor", "original_max_position_embeddings": "rope_original_max",
             "low_freq_factor": "rope_low_freq", "high_freq_factor": "rope_high_freq", "beta_fast": "rope_beta_fast",
             "beta_slow": "rope_beta_slow", "attention_factor": "rope_attention_factor"}
READS = {"linear": ("factor",), "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor",
                                           "high_freq_factor"),
         "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor")}
SOURCE = "<hf config>"  # the name diagnostics carry until block_text knows the file


def _fail(message: str, hint: str | None = None, at: tuple[str | int, ...] = ()) -> BlockError:
    """A config the file cannot state (E0800), at the JSON path of the field that asks for it."""
    return BlockError([_error("E0800", message, json_span(SOURCE, at), hint=hint)])


class _Config:
    """The fields the family's HF code reads, checked and defaulted by ``hf_config.read_fields``."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = dict(raw)

    def get(self, key: str, default: Any = None) -> Any:
        """The field's value; ``default`` where it is null, or where the family does not read it (HF's code then
        behaves as that default)."""
        v = self.raw.get(key)
        return default if v is None else v

    def need(self, key: str) -> Any:
        if self.raw.get(key) is None:
            raise _fail(f"the config of model type '{self.raw.get('model_type')}' has no '{key}'", at=(key,))
        return self.raw[key]

    def rope(self) -> dict[str, Any]:
        params = dict(self.get("rope_parameters") or {"rope_type": "default", "rope_theta": 10000.0})
        kind = params.get("rope_type", "default")
        if kind not in ROPE_SCALINGS:
            raise _fail(f"RoPE scaling type '{kind}' is not supported", "supported: " + ", ".join(ROPE_SCALINGS),
                        at=("rope_parameters", "rope_type"))
        if kind == "yarn" and params.get("truncate") is False:
            raise _fail("YaRN without truncated correction bounds (truncate=false) is not supported",
                        at=("rope_parameters", "truncate"))
        if kind == "yarn" and params.get("mscale") and params.get("mscale_all_dim"):
            raise _fail("YaRN's mscale and mscale_all_dim are not supported", "give attention_factor instead",
                        at=("rope_parameters", "mscale"))
        return params

    def act(self, key: str = "hidden_act", default: str = "silu") -> str:
        name = self.get(key, default)
        if name not in ACTS:
            raise _fail(f"activation '{name}' is not supported", "supported: " + ", ".join(sorted(ACTS)), at=(key,))
        return ACTS[name]


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 2 ** 53 else repr(float(v))


def _header(cls: str, model_type: str, c: _Config, extra: dict[str, int]) -> list[str]:
    dims = {"D": c.need("hidden_size"), "V": c.need("vocab_size"), **extra}
    lines = [f"# {cls} (transformers model_type '{model_type}'), written by `blockir import hf` from its config.",
             "# Declaration names are the HF attribute names: the real state dict loads with strict=True.", "",
             "dim B: batch", "dim S: seq"]
    roles = {"D": "model", "F": "hidden", "V": "vocab", "P": "vocab"}
    lines += [f"dim {k}: {roles.get(k, 'hidden')} = {v}" for k, v in dims.items() if k != "L"]
    return lines + [f"const L = {dims['L']}", ""] if "L" in dims else lines + [""]


def _attn_opts(c: _Config, exact: bool, rotary: bool = True, head_dim: int | None = None) -> list[str]:
    h = c.need("num_attention_heads")
    opts = [f"heads={h}"]
    kv = c.get("num_key_value_heads", h)
    if kv != h:
        opts.append(f"kv_heads={kv}")
    hd = head_dim if head_dim is not None else c.get("head_dim") or c.need("hidden_size") // h
    if hd * h != c.need("hidden_size"):
        opts.append(f"head_dim={hd}")
    if rotary:
        rope = c.rope()
        opts += ["rope=true", f"rope_theta={_num(rope['rope_theta'])}"]
        factor = rope.get("partial_rotary_factor", 1.0)
        if factor != 1.0:
            opts.append(f"rotary_dim={int(hd * factor)}")
        if exact:  # model.to(dtype) casts HF's inv_freq buffer too
            opts.append("rope_freqs=input")
        opts += _rope_scaling(c, rope)
    p = c.get("attention_dropout", c.get("attn_pdrop", 0.0))
    if p:
        opts.append(f"dropout={_num(p)}")
    return opts + exact_impl(c, cached=True) if exact else opts


def exact_impl(c: _Config, cached: bool) -> list[str]:
    """The exact mode's attention options: HF's eager op, reading keys and values from its KV cache where the
    class caches them by default (a decoder with ``use_cache``), whose contiguous layout decides how the matmuls
    round."""
    return ["impl=eager"] + (["kv_cache=true"] if cached and c.get("use_cache", True) else [])


def _rope_scaling(c: _Config, rope: dict[str, Any]) -> list[str]:
    kind = rope["rope_type"]
    if kind == "default":
        return []
    values = dict(rope)
    if kind == "yarn" and values.get("factor") is None:  # HF derives it from the two context lengths
        values["factor"] = c.need("max_position_embeddings") / values["original_max_position_embeddings"]
    if kind in ("llama3", "yarn"):
        values.setdefault("original_max_position_embeddings", c.get("max_position_embeddings"))
    return [f"rope_scaling={kind}"] + [f"{ROPE_ARGS[k]}={_num(values[k])}" for k in READS[kind]
                                       if values.get(k) is not None]


def _decl(name: str, kind: str, args: list[str]) -> str:
    return f"  {name}: {kind}({', '.join(args)})"


def _rms(c: _Config, key: str = "rms_norm_eps", offset: int = 0, cast: str = "before_weight") -> str:
    return f"rmsnorm(D, eps={_num(c.get(key, 1e-6))}, offset={offset}, cast={cast})"


def _window(c: _Config) -> list[str]:
    """The window of every layer; a per-layer mix is written as an expression in ``layer`` (0: no window)."""
    types = c.get("layer_types")
    window = c.get("sliding_window")
    if not window:
        return []
    if not types:
        return [f"window={window}"] if c.get("use_sliding_window", True) else []
    sliding = [t == "sliding_attention" for t in types]
    if all(sliding):
        return [f"window={window}"]
    if not any(sliding):
        return []
    for first, sign in ((True, "+"), (False, "-")):
        if sliding == [(i % 2 == 0) == first for i in range(len(types))]:
            return [f"window={window} * (1 {sign} (-1) ** layer) / 2"]
    raise _fail("this mix of sliding and full attention layers is not supported",
                "supported: all sliding, all full, or alternating layer by layer", at=("layer_types",))


def _padding(c: _Config) -> list[str]:
    """The classes that pass ``pad_token_id`` to ``nn.Embedding``: that row learns nothing."""
    pad = c.get("pad_token_id")
    return [f"padding_idx={pad}"] if pad is not None else []


def _model(cls: str, base: str, layer: str, c: _Config, norm: str, extra: list[str] | None = None,
           scale: str | None = None, softcap: float | None = None) -> list[str]:
    tied = bool(c.get("tie_word_embeddings", False))
    embed = ["V", "D"] + ([f"scale={scale}"] if scale else []) + _padding(c)
    head = ["V"] + (["tied=true"] if tied else []) + ([f"softcap={_num(softcap)}"] if softcap else [])
    return [f"model {cls}(input_ids: [B, S]) -> [B, S, V] {{",
            _decl(f"{base}.embed_tokens", "embedding", embed),
            f"  {base}.layers: {layer} * L",
            f"  {base}.norm: {norm}",
            _decl("lm_head", "head", head),
            *(extra or []),
            f"  return lm_head({base}.norm({base}.layers({base}.embed_tokens(input_ids))))",
            "}"]


def _llama_like(cls: str, prefix: str, qkv_bias: bool | None = None, qk_norm: bool = False,
                cast: str = "before_weight", out_bias: bool | str | None = None, rope_style: str = "half",
                norm: Callable[[_Config], str] | None = None, gated: bool = True,
                rope_f32: bool = False) -> Callable[..., str]:
    """LLaMA's layout. ``qkv_bias``/``out_bias``: fixed by the class, read from a config key (a string), or
    (None) from ``attention_bias``; ``cast``: the RMSNorm cast order; ``norm``: another norm declaration for
    all three norms; ``gated=False``: a plain ``up_proj``/``down_proj`` MLP."""
    def write(c: _Config, model_type: str, exact: bool) -> str:
        layer = f"{prefix}DecoderLayer"
        bias = c.get("attention_bias", False)
        layers = c.need("num_hidden_layers")
        if not all((c.get("no_rope_layers") or [1])[:layers]):
            raise _fail("layers without RoPE (no_rope_layers) are not supported", "every layer must use RoPE",
                        at=("no_rope_layers",))
        attn = _attn_opts(c, exact) + _window(c)
        if rope_style != "half":
            attn.append(f"rope_style={rope_style}")
        if rope_f32:
            attn.append("rope_f32=true")
        if bias if qkv_bias is None else qkv_bias:
            attn.append("bias=true")
        if c.get(out_bias, False) if isinstance(out_bias, str) else \
                (qkv_bias is None and bias) if out_bias is None else out_bias:
            attn.append("out_bias=true")
        if qk_norm:
            attn += ["qk_norm=rmsnorm", f"qk_norm_eps={_num(c.get('rms_norm_eps', 1e-6))}"]
        mlp = ["F", f"act={c.act()}"] + (["bias=true"] if c.get("mlp_bias", False) else [])
        if not gated:
            mlp = ["F", f"act={c.act()}", f"bias={str(c.get('mlp_bias', False)).lower()}", "fc1=up_proj",
                   "fc2=down_proj"]
        n = norm(c) if norm else _rms(c, cast=cast)
        drop = _drop(c.get("residual_dropout", 0.0))  # Seed-OSS drops each branch output
        lines = _header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
        attn_scale, res, emb, logits = _multipliers(c, model_type)
        if attn_scale is not None:
            attn.append(f"scale={_num(attn_scale)}")
        lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
                  f"  input_layernorm: {n}", _decl("self_attn", "self_attention", attn),
                  f"  post_attention_layernorm: {n}", _decl("mlp", "gated_mlp" if gated else "mlp", mlp),
                  f"  h = x + {drop('self_attn(input_layernorm(x))')}{res}",
                  f"  y = h + {drop('mlp(post_attention_layernorm(h))')}{res}",
                  "  return y", "}", ""]
        model = _model(cls, "model", layer, c, n)
        if emb or logits:
            model[-2] = f"  return {logits}lm_head(model.norm(model.layers(model.embed_tokens(input_ids){emb})))"
        return "\n".join(lines + model) + "\n"
    return write


def _multipliers(c: _Config, model_type: str) -> tuple[float | None, str, str, str]:
    """Granite's constants: attention scale, and the residual, embedding and logits factors as written."""
    if model_type != "granite":
        return None, "", "", ""
    logits = float(c.get("logits_scaling", 1.0))
    mantissa, _ = math.frexp(logits)
    if mantissa != 0.5:  # 1 / logits is exact only for a power of two; the language has no tensor division
        raise _fail(f"logits_scaling={_num(logits)} is not a power of two", at=("logits_scaling",), hint="HF divides the logits by it; "
                    "blockir multiplies by the reciprocal, which equals only for powers of two")
    res = _num(c.get("residual_multiplier", 1.0))
    emb = _num(c.get("embedding_multiplier", 1.0))
    return (float(c.get("attention_multiplier", 1.0)), f" * {res}", f" * {emb}",
            "" if logits == 1 else f"{_num(1 / logits)} * ")


def _gemma(c: _Config, model_type: str, exact: bool) -> str:
    cls, layer = "GemmaForCausalLM", "GemmaDecoderLayer"
    norm = _rms(c, offset=1, cast="after_weight")
    attn = _attn_opts(c, exact) + (["bias=true", "out_bias=true"] if c.get("attention_bias", False) else [])
    mlp = ["F", f"act={c.act('hidden_act', 'gelu_pytorch_tanh')}"]
    lines = _header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  input_layernorm: {norm}", _decl("self_attn", "self_attention", attn),
              f"  post_attention_layernorm: {norm}", _decl("mlp", "gated_mlp", mlp),
              "  h = x + self_attn(input_layernorm(x))", "  y = h + mlp(post_attention_layernorm(h))",
              "  return y", "}", ""]
    return "\n".join(lines + _model(cls, "model", layer, c, norm, scale="D ** 0.5")) + "\n"


def _gemma2(c: _Config, model_type: str, exact: bool) -> str:
    cls, layer = "Gemma2ForCausalLM", "Gemma2DecoderLayer"
    norm = _rms(c, offset=1, cast="after_weight")
    attn = _attn_opts(c, exact) + _window(c) + [f"scale={_num(float(c.get('query_pre_attn_scalar', 256)) ** -0.5)}"]
    if c.get("attn_logit_softcapping") is not None:
        attn.append(f"softcap={_num(c.get('attn_logit_softcapping'))}")
    return sandwich_text(cls, layer, model_type, c, norm, attn)


def sandwich_text(cls: str, layer: str, model_type: str, c: _Config, norm: str, attn: list[str]) -> str:
    """A Gemma 2-style file: four (1 + w) RMSNorms around each branch, a gated MLP, embeddings times sqrt(D), a
    tied head and soft-capped logits; ``attn`` holds the attention options of the family."""
    if c.get("attention_bias", False):
        attn += ["bias=true", "out_bias=true"]
    mlp = ["F", f"act={c.act('hidden_activation', 'gelu_pytorch_tanh')}"]
    lines = _header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  input_layernorm: {norm}", _decl("self_attn", "self_attention", attn),
              f"  post_attention_layernorm: {norm}", f"  pre_feedforward_layernorm: {norm}",
              _decl("mlp", "gated_mlp", mlp), f"  post_feedforward_layernorm: {norm}",
              "  h = x + post_attention_layernorm(self_attn(input_layernorm(x)))",
              "  y = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))", "  return y", "}", ""]
    return "\n".join(lines + _model(cls, "model", layer, c, norm, scale="D ** 0.5",
                                    softcap=c.get("final_logit_softcapping"))) + "\n"


def _olmo2(cls: str, layer: str) -> Callable[..., str]:
    return lambda c, model_type, exact: _olmo2_text(cls, layer, c, model_type, exact)


def _olmo2_text(cls: str, layer: str, c: _Config, model_type: str, exact: bool) -> str:
    norm = _rms(c, cast="after_weight")
    attn = _attn_opts(c, exact) + _window(c) + ["rope_f32=true", "qk_norm=rmsnorm", "qk_norm_axis=width", "qk_norm_cast=after_weight",
                                   f"qk_norm_eps={_num(c.get('rms_norm_eps', 1e-6))}"]
    if c.get("attention_bias", False):
        attn += ["bias=true", "out_bias=true"]
    lines = _header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              _decl("self_attn", "self_attention", attn), f"  post_attention_layernorm: {norm}",
              _decl("mlp", "gated_mlp", ["F", f"act={c.act()}"]), f"  post_feedforward_layernorm: {norm}",
              "  h = x + post_attention_layernorm(self_attn(x))", "  y = h + post_feedforward_layernorm(mlp(h))",
              "  return y", "}", ""]
    return "\n".join(lines + _model(cls, "model", layer, c, norm)) + "\n"


def _phi3(c: _Config, model_type: str, exact: bool) -> str:
    cls, layer = "Phi3ForCausalLM", "Phi3DecoderLayer"
    norm = _rms(c, key="rms_norm_eps")
    attn = _attn_opts(c, exact) + _window(c) + ["fused=stacked"]
    mlp = ["F", f"act={c.act()}", "fused=true"]
    p = c.get("resid_pdrop", 0.0)
    drop = (lambda e: f"dropout({e}, p={_num(p)})") if p else (lambda e: e)
    lines = _header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  input_layernorm: {norm}", _decl("self_attn", "self_attention", attn),
              f"  post_attention_layernorm: {norm}", _decl("mlp", "gated_mlp", mlp),
              f"  h = x + {drop('self_attn(input_layernorm(x))')}", f"  y = h + {drop('mlp(post_attention_layernorm(h))')}",
              "  return y", "}", ""]
    return "\n".join(lines + _model(cls, "model", layer, c, norm)) + "\n"


def _gpt2(c: _Config, model_type: str, exact: bool) -> str:
    cls, layer = "GPT2LMHeadModel", "GPT2Block"
    d = c.get("n_embd", c.get("hidden_size"))
    c.raw.setdefault("hidden_size", d)
    c.raw["num_attention_heads"] = c.get("n_head", c.get("num_attention_heads"))
    eps = _num(c.get("layer_norm_epsilon", 1e-5))
    attn = _attn_opts(c, exact, rotary=False) + ["bias=true", "out_bias=true", "fused=stacked", "conv1d=true",
                                                 "qkv=c_attn", "o=c_proj", "softmax_f32=false"]
    if not c.get("scale_attn_weights", True):
        attn.append("scale=1")
    mlp = ["F", f"act={c.act('activation_function', 'gelu_new')}", "fc1=c_fc", "fc2=c_proj", "conv1d=true"]
    p, e = c.get("resid_pdrop", 0.1), c.get("embd_pdrop", 0.1)
    lines = _header(cls, model_type, c, {"D": d, "F": c.get("n_inner") or 4 * d, "P": c.get("n_positions", 1024),
                                         "L": c.get("n_layer", c.get("num_hidden_layers"))})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  ln_1: layernorm(D, eps={eps})", _decl("attn", "self_attention", attn),
              f"  ln_2: layernorm(D, eps={eps})", _decl("mlp", "mlp", mlp),
              f"  h = x + dropout(attn(ln_1(x)), p={_num(p)})", f"  y = h + dropout(mlp(ln_2(h)), p={_num(p)})",
              "  return y", "}", "",
              f"model {cls}(input_ids: [B, S]) -> [B, S, V] {{",
              "  transformer.wte: embedding(V, D)", "  transformer.wpe: embedding(P, D, positions=true)",
              f"  transformer.h: {layer} * L", f"  transformer.ln_f: layernorm(D, eps={eps})",
              _decl("lm_head", "head", ["V"] + (["tied=true"] if c.get("tie_word_embeddings", True) else [])),
              f"  # embd_pdrop={_num(e)} (dropout on the sum of the two lookups while training) is not written:",
              "  # the verifiers read that sum as a residual add. Evaluation is unaffected.",
              "  x = transformer.wte(input_ids) + transformer.wpe(input_ids)",
              "  return lm_head(transformer.ln_f(transformer.h(x)))", "}"]
    return "\n".join(lines) + "\n"


def _gpt_neox(c: _Config, model_type: str, exact: bool) -> str:
    cls, layer = "GPTNeoXForCausalLM", "GPTNeoXLayer"
    eps = _num(c.get("layer_norm_eps", 1e-5))
    attn = _attn_opts(c, exact) + ["bias=true", "out_bias=true", "fused=heads", "qkv=query_key_value", "o=dense"]
    if not c.get("attention_bias", True):
        attn = [a for a in attn if not a.startswith(("bias", "out_bias"))]
    mlp = ["F", f"act={c.act(default='gelu')}", "fc1=dense_h_to_4h", "fc2=dense_4h_to_h"]
    lines = _header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    # HF's op order and summation order: the first fixes how autograd accumulates x's gradient
    drop = _drop(c.get("hidden_dropout", 0.0))  # HF's post_attention_dropout and post_mlp_dropout
    update = ([f"  a = {drop('attention(input_layernorm(x))')}", f"  m = {drop('mlp(post_attention_layernorm(x))')}",
               "  y = m + a + x"] if c.get("use_parallel_residual", True) else
              [f"  h = x + {drop('attention(input_layernorm(x))')}", f"  y = h + {drop('mlp(post_attention_layernorm(h))')}"])
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  input_layernorm: layernorm(D, eps={eps})", f"  post_attention_layernorm: layernorm(D, eps={eps})",
              _decl("attention", "self_attention", attn), _decl("mlp", "mlp", mlp), *update, "  return y", "}", "",
              f"model {cls}(input_ids: [B, S]) -> [B, S, V] {{",
              "  gpt_neox.embed_in: embedding(V, D)", f"  gpt_neox.layers: {layer} * L",
              f"  gpt_neox.final_layer_norm: layernorm(D, eps={eps})",
              _decl("lm_head", "head", ["V"] + (["tied=true"] if c.get("tie_word_embeddings", False) else [])),
              "  return lm_head(gpt_neox.final_layer_norm(gpt_neox.layers(gpt_neox.embed_in(input_ids))))", "}"]
    return "\n".join(lines) + "\n"


def no_embedding_dropout(c: _Config, key: str) -> str:
    """Dropout on the token embeddings is refused: the verifiers read it as dropout on the residual state (E0402)."""
    if c.get(key, 0.0):
        raise _fail(f"dropout on the token embeddings ({key}={_num(c.get(key))}) is not supported",
                    f"the language reads it as dropout on the residual state; set {key} to 0 (it acts only in "
                    "training)", at=(key,))
    return ""


def _drop(p: float) -> Callable[[str], str]:
    return (lambda e: f"dropout({e}, p={_num(p)})") if p else (lambda e: e)


def _starcoder2(c: _Config, model_type: str, exact: bool) -> str:
    cls, layer = "Starcoder2ForCausalLM", "Starcoder2DecoderLayer"
    norm = f"layernorm(D, eps={_num(c.get('norm_epsilon', 1e-5))})"
    bias = ["bias=true", "out_bias=true"] if c.get("use_bias", True) else []
    attn = _attn_opts(c, exact) + _window(c) + bias
    mlp = ["F", f"act={c.act(default='gelu_pytorch_tanh')}", "fc1=c_fc", "fc2=c_proj"] + \
        ([] if c.get("use_bias", True) else ["bias=false"])
    drop = _drop(c.get("residual_dropout", 0.0))
    lines = _header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{",
              f"  input_layernorm: {norm}", _decl("self_attn", "self_attention", attn),
              f"  post_attention_layernorm: {norm}", _decl("mlp", "mlp", mlp),
              f"  h = x + {drop('self_attn(input_layernorm(x))')}", f"  y = h + {drop('mlp(post_attention_layernorm(h))')}",
              "  return y", "}", ""]
    model = _model(cls, "model", layer, c, norm)
    no_embedding_dropout(c, "embedding_dropout")
    return "\n".join(lines + model) + "\n"


def _stablelm(c: _Config, model_type: str, exact: bool) -> str:
    cls, layer = "StableLmForCausalLM", "StableLmDecoderLayer"
    norm = f"layernorm(D, eps={_num(c.get('layer_norm_eps', 1e-5))})"
    attn = _attn_opts(c, exact) + (["bias=true"] if c.get("use_qkv_bias", False) else [])
    drop = _drop(c.get("hidden_dropout", 0.0))
    # StableLM drops the MLP update only; where it also drops attention probabilities, p=0 on the attention
    # update says the missing residual dropout is the architecture's, not a confusion of the two settings
    kept = (lambda e: f"dropout({e}, p=0)") if c.get("hidden_dropout", 0.0) and c.get("attention_dropout", 0.0) \
        else (lambda e: e)
    lines = _header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{", f"  input_layernorm: {norm}",
              _decl("self_attn", "self_attention", attn), _decl("mlp", "gated_mlp", ["F", f"act={c.act()}"])]
    if c.get("use_parallel_residual", False):  # one norm feeds both branches; HF runs attention first
        lines += ["  n = input_layernorm(x)", f"  a = {kept('self_attn(n)')}", f"  m = {drop('mlp(n)')}",
                  "  y = x + a + m"]
    else:
        lines += [f"  post_attention_layernorm: {norm}", f"  h = x + {kept('self_attn(input_layernorm(x))')}",
                  f"  y = h + {drop('mlp(post_attention_layernorm(h))')}"]
    lines += ["  return y", "}", ""]
    return "\n".join(lines + _model(cls, "model", layer, c, norm)) + "\n"


def _phi(c: _Config, model_type: str, exact: bool) -> str:
    cls, layer = "PhiForCausalLM", "PhiDecoderLayer"
    norm = f"layernorm(D, eps={_num(c.get('layer_norm_eps', 1e-5))})"
    attn = _attn_opts(c, exact) + ["bias=true", "out_bias=true", "o=dense"]
    drop = _drop(c.get("resid_pdrop", 0.0))
    lines = _header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{", f"  input_layernorm: {norm}",
              _decl("self_attn", "self_attention", attn), _decl("mlp", "mlp", ["F", f"act={c.act(default='gelu_new')}"]),
              "  n = input_layernorm(x)", f"  a = {drop('self_attn(n)')}", f"  m = {drop('mlp(n)')}", "  y = a + m + x",
              "  return y", "}", "",
              f"model {cls}(input_ids: [B, S]) -> [B, S, V] {{",
              _decl("model.embed_tokens", "embedding", ["V", "D"] + _padding(c)), f"  model.layers: {layer} * L",
              f"  model.final_layernorm: {norm}",
              _decl("lm_head", "head", ["V", "bias=true"] + (["tied=true"] if c.get("tie_word_embeddings") else [])),
              "  x = " + no_embedding_dropout(c, "embd_pdrop") + "model.embed_tokens(input_ids)",
              "  return lm_head(model.final_layernorm(model.layers(x)))", "}"]
    return "\n".join(lines) + "\n"


def _cohere(c: _Config, model_type: str, exact: bool) -> str:
    cls, layer = "CohereForCausalLM", "CohereDecoderLayer"
    norm = f"layernorm(D, eps={_num(c.get('layer_norm_eps', 1e-5))}, bias=false, two_pass=true, recenter=true)"
    attn = _attn_opts(c, exact) + ["rope_style=interleaved", "rope_f32=true", "rope_tables=input"] + \
        (["bias=true", "out_bias=true"] if c.get("attention_bias", False) else [])
    lines = _header(cls, model_type, c, {"F": c.need("intermediate_size"), "L": c.need("num_hidden_layers")})
    lines += [f"block {layer}(x: [B, S, D]) -> [B, S, D] {{", f"  input_layernorm: {norm}",
              _decl("self_attn", "self_attention", attn), _decl("mlp", "gated_mlp", ["F", f"act={c.act()}"]),
              "  n = input_layernorm(x)", "  a = self_attn(n)", "  m = mlp(n)", "  y = x + a + m",
              "  return y", "}", ""]
    model = _model(cls, "model", layer, c, norm)
    model[-2] = f"  return {_num(c.get('logit_scale', 0.0625))} * lm_head(model.norm(model.layers(model.embed_tokens(input_ids))))"
    return "\n".join(lines + model) + "\n"


WRITERS: dict[str, Callable[[_Config, str, bool], str]] = {
    "llama": _llama_like("LlamaForCausalLM", "Llama"),
    "mistral": _llama_like("MistralForCausalLM", "Mistral", qkv_bias=False),
    "qwen2": _llama_like("Qwen2ForCausalLM", "Qwen2", qkv_bias=True),
    "qwen3": _llama_like("Qwen3ForCausalLM", "Qwen3", qk_norm=True),
    "gemma": _gemma,
    "olmo2": _olmo2("Olmo2ForCausalLM", "Olmo2DecoderLayer"),
    "ministral": _llama_like("MinistralForCausalLM", "Ministral", qkv_bias=False),
    "seed_oss": _llama_like("SeedOssForCausalLM", "SeedOss", out_bias="attention_out_bias"),
    "arcee": _llama_like("ArceeForCausalLM", "Arcee", gated=False),
    "gemma2": _gemma2,
    "phi3": _phi3,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "helium": _llama_like("HeliumForCausalLM", "Helium", cast="after_weight", out_bias=False,
                          rope_style="interleaved"),
    "granite": _llama_like("GraniteForCausalLM", "Granite"),
    "smollm3": _llama_like("SmolLM3ForCausalLM", "SmolLM3"),
    "starcoder2": _starcoder2,
    "stablelm": _stablelm,
    "phi": _phi,
    "cohere": _cohere,
    "olmo": _llama_like("OlmoForCausalLM", "Olmo", norm=lambda c: "layernorm(D, eps=1e-5, affine=false, upcast=true)",
                        rope_f32=True),
}


def block_text(config: Any, exact: bool = False, *, source: str = SOURCE) -> str:
    """The `.block` text for a transformers config (a dict, a JSON config's contents, or a config object), of the
    class its ``architectures`` names; every problem is a ``BlockError`` located at ``source: $.field``.

    ``exact`` writes ``impl=eager`` on every attention: HF's eager reference op for op.
    """
    from blockir.importers.hf.entry import import_text
    return import_text(config, exact, source=source)


from blockir.importers.hf import more as hf_more  # noqa: E402,F401  (registers its writers into WRITERS)
from blockir.importers.hf import gptj as hf_gptj  # noqa: E402,F401  (registers its writers into WRITERS)
from blockir.importers.hf import periodic as hf_periodic  # noqa: E402,F401  (registers its writers into WRITERS)
