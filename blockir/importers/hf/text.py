"""What every family writer shares: the checked config, the norm declaration, and the lines the families
write alike (header, attention options, the causal-LM model, dropout of an update).

A writer turns the values ``config.read_fields`` resolved into `.block` text; a problem the file cannot
state is an E0800 at the JSON path of the field that asks for it (:func:`fail`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from blockir.diagnostics import BlockError, error, json_span
from blockir.importers.hf.family import ACTS

ROPE_SCALINGS = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")
# rope_parameters key -> the attention argument that states it
ROPE_ARGS = {"factor": "rope_factor", "original_max_position_embeddings": "rope_original_max",
             "low_freq_factor": "rope_low_freq", "high_freq_factor": "rope_high_freq", "beta_fast": "rope_beta_fast",
             "beta_slow": "rope_beta_slow", "attention_factor": "rope_attention_factor",
             "short_factor": "rope_short_factor", "long_factor": "rope_long_factor"}
READS = {"linear": ("factor",), "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor",
                                           "high_freq_factor"),
         "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor"),
         "dynamic": ("factor", "original_max_position_embeddings"),
         "longrope": ("factor", "original_max_position_embeddings", "attention_factor", "short_factor",
                      "long_factor")}
SOURCE = "<hf config>"  # the name diagnostics carry until the import knows the file


def fail(message: str, hint: str | None = None, at: tuple[str | int, ...] = ()) -> BlockError:
    """A config the file cannot state (E0800), at the JSON path of the field that asks for it."""
    return BlockError([error("E0800", message, json_span(SOURCE, at), hint=hint)])


@dataclass(frozen=True)
class Norm:
    """How a model type's HF classes build every norm: the kind, where eps comes from (a config field, a
    constant the class fixes, or None for the kind's default), the options the class fixes, and the boolean
    config field, if any, that turns the learned affine off."""

    kind: str
    eps: str | float | None = None
    options: tuple[str, ...] = ()
    affine: str | None = None


def rms(eps: str = "rms_norm_eps", offset: int = 0, cast: str = "before_weight") -> Norm:
    """An RMSNorm as LLaMA's relatives build it: eps from ``eps``, a gain offset and the cast order."""
    return Norm("rmsnorm", eps, (f"offset={offset}", f"cast={cast}"))


class Config:
    """The fields the family's HF code reads, checked and defaulted by ``config.read_fields``, and the way the
    model type declares its norms."""

    def __init__(self, raw: Mapping[str, Any], norm: Norm) -> None:
        self.raw = dict(raw)
        self.norm_spec = norm

    def get(self, key: str, default: Any = None) -> Any:
        """The field's value; ``default`` where it is null, or where the family does not read it (HF's code then
        behaves as that default)."""
        v = self.raw.get(key)
        return default if v is None else v

    def need(self, key: str) -> Any:
        if self.raw.get(key) is None:
            raise fail(f"the config of model type '{self.raw.get('model_type')}' has no '{key}'", at=(key,))
        return self.raw[key]

    def norm(self, axis: str = "D") -> str:
        """The declaration of one of the model's norms over ``axis``: the only place a norm is spelled."""
        spec = self.norm_spec
        args = [axis]
        if spec.eps is not None:
            args.append(f"eps={num(self.get(spec.eps) if isinstance(spec.eps, str) else spec.eps)}")
        args += spec.options
        if spec.affine is not None and not self.get(spec.affine, True):
            args.append("affine=false")
        return f"{spec.kind}({', '.join(args)})"

    def rope(self) -> dict[str, Any]:
        params = dict(self.get("rope_parameters") or {"rope_type": "default", "rope_theta": 10000.0})
        kind = params.get("rope_type", "default")
        if kind not in ROPE_SCALINGS:
            raise fail(f"RoPE scaling type '{kind}' is not supported", "supported: " + ", ".join(ROPE_SCALINGS),
                       at=("rope_parameters", "rope_type"))
        if kind == "yarn" and params.get("truncate") is False:
            raise fail("YaRN without truncated correction bounds (truncate=false) is not supported",
                       at=("rope_parameters", "truncate"))
        if kind == "yarn" and params.get("mscale") and params.get("mscale_all_dim"):
            raise fail("YaRN's mscale and mscale_all_dim are not supported", "give attention_factor instead",
                       at=("rope_parameters", "mscale"))
        return params

    def act(self, key: str = "hidden_act", default: str = "silu") -> str:
        name = self.get(key, default)
        if name not in ACTS:
            raise fail(f"activation '{name}' is not supported", "supported: " + ", ".join(sorted(ACTS)), at=(key,))
        return ACTS[name]


def num(v: float) -> str:
    """A number as the language reads it back: an integer where it is one, else Python's shortest repr."""
    return str(int(v)) if float(v).is_integer() and abs(v) < 2 ** 53 else repr(float(v))


def decl(name: str, kind: str, args: list[str]) -> str:
    return f"  {name}: {kind}({', '.join(args)})"


def header(cls: str, model_type: str, c: Config, extra: dict[str, int]) -> list[str]:
    """The comment naming the class, and the dims (D and V from the config, ``extra`` besides; L a constant)."""
    dims = {"D": c.need("hidden_size"), "V": c.need("vocab_size"), **extra}
    lines = [f"# {cls} (transformers model_type '{model_type}'), written by `blockir import hf` from its config.",
             "# Declaration names are the HF attribute names: the real state dict loads with strict=True.", "",
             "dim B: batch", "dim S: seq"]
    roles = {"D": "model", "F": "hidden", "V": "vocab", "P": "vocab"}
    lines += [f"dim {k}: {roles.get(k, 'hidden')} = {v}" for k, v in dims.items() if k != "L"]
    return lines + [f"const L = {dims['L']}", ""] if "L" in dims else lines + [""]


def attn_opts(c: Config, exact: bool, rotary: bool = True, head_dim: int | None = None,
              partial: bool = False) -> list[str]:
    """The attention options a decoder's config gives: heads, key/value heads, head width, RoPE, dropout;
    ``partial``: the family's rotary embedding turns the first ``partial_rotary_factor`` of each head's channels
    (most classes' RoPE reads no such field and turns every channel, whatever the config says)."""
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
        opts += ["rope=true", f"rope_theta={num(rope['rope_theta'])}"]
        factor = rope.get("partial_rotary_factor", 1.0) if partial else 1.0
        if factor != 1.0:
            opts.append(f"rotary_dim={int(hd * factor)}")
        if exact:  # model.to(dtype) casts HF's inv_freq buffer too
            opts.append("rope_freqs=input")
        opts += _rope_scaling(c, rope)
    p = c.get("attention_dropout", c.get("attn_pdrop", 0.0))
    if p:
        opts.append(f"dropout={num(p)}")
    return opts + exact_impl(c, cached=True) if exact else opts


def exact_impl(c: Config, cached: bool) -> list[str]:
    """The exact mode's attention options: HF's eager op, reading keys and values from its KV cache where the
    class caches them by default (a decoder with ``use_cache``), whose contiguous layout decides how the matmuls
    round."""
    return ["impl=eager"] + (["kv_cache=true"] if cached and c.get("use_cache", True) else [])


def _rope_scaling(c: Config, rope: dict[str, Any]) -> list[str]:
    kind = rope["rope_type"]
    if kind == "default":
        return []
    values = dict(rope)
    if kind in ("llama3", "yarn", "longrope"):
        # a class with a top-level original_max_position_embeddings (Phi-3) puts it over the dict's
        values["original_max_position_embeddings"] = c.get("original_max_position_embeddings") or \
            values.get("original_max_position_embeddings") or c.get("max_position_embeddings")
    if kind == "dynamic":  # the base grows past max_position_embeddings, the context the class was built for
        values["original_max_position_embeddings"] = c.need("max_position_embeddings")
    if kind in ("yarn", "longrope") and values.get("factor") is None:  # HF derives it from the two context lengths
        values["factor"] = c.need("max_position_embeddings") / values["original_max_position_embeddings"]
    return [f"rope_scaling={kind}"] + [f"{ROPE_ARGS[k]}={_value(values[k])}" for k in READS[kind]
                                       if values.get(k) is not None]


def _value(v: Any) -> str:
    return "[" + ", ".join(num(x) for x in v) + "]" if isinstance(v, list) else num(v)


def every_nth(flags: list[bool], flipped: bool = True) -> tuple[int, str] | None:
    """The period n and an indicator in ``layer`` for ``flags`` that are false on every n-th layer and true on
    the others (``(layer + 1) % n == 0``: 1 on the true ones), or, unless ``flipped`` is false, true only there
    (``1 - …``); None for flags without such a period. Constant expressions have ``%`` and ``//``, so one block
    serves every layer."""
    for flip in (False, True) if flipped else (False,):
        for period in range(1, len(flags) + 2):
            if flags == [((i + 1) % period != 0) != flip for i in range(len(flags))]:
                ind = "0" if period == 1 else f"(((layer + 1) % {period} + {period - 1}) // {period})"
                return period, (f"(1 - {ind})" if period > 1 else "1") if flip else ind
    return None


def window(c: Config) -> list[str]:
    """The window of every layer; a per-layer mix is written as an expression in ``layer`` (0: no window)."""
    types = c.get("layer_types")
    size = c.get("sliding_window")
    if not size:
        return []
    if not types:
        return [f"window={size}"] if c.get("use_sliding_window", True) else []
    sliding = [t == "sliding_attention" for t in types]
    if all(sliding):
        return [f"window={size}"]
    if not any(sliding):
        return []
    for first, sign in ((True, "+"), (False, "-")):
        if sliding == [(i % 2 == 0) == first for i in range(len(types))]:
            return [f"window={size} * (1 {sign} (-1) ** layer) / 2"]
    periodic = every_nth(sliding)
    if periodic is not None:
        return [f"window={size} * {periodic[1]}"]
    raise fail("this mix of sliding and full attention layers is not supported",
               "supported: all sliding, all full, alternating layer by layer, or every n-th layer full or sliding",
               at=("layer_types",))


def padding(c: Config) -> list[str]:
    """The classes that pass ``pad_token_id`` to ``nn.Embedding``: that row learns nothing."""
    pad = c.get("pad_token_id")
    return [f"padding_idx={pad}"] if pad is not None else []


def causal_lm(cls: str, base: str, layer: str, c: Config, extra: list[str] | None = None,
              scale: str | None = None, softcap: float | None = None) -> list[str]:
    """LLaMA's ``*ForCausalLM``: embedding, the stack, a final norm and the head, under ``base``."""
    tied = bool(c.get("tie_word_embeddings", False))
    embed = ["V", "D"] + ([f"scale={scale}"] if scale else []) + padding(c)
    head = ["V"] + (["tied=true"] if tied else []) + ([f"softcap={num(softcap)}"] if softcap else [])
    return [f"model {cls}(input_ids: [B, S]) -> [B, S, V] {{",
            decl(f"{base}.embed_tokens", "embedding", embed),
            f"  {base}.layers: {layer} * L",
            f"  {base}.norm: {c.norm()}",
            decl("lm_head", "head", head),
            *(extra or []),
            f"  return lm_head({base}.norm({base}.layers({base}.embed_tokens(input_ids))))",
            "}"]


def no_embedding_dropout(c: Config, key: str) -> str:
    """Dropout on the token embeddings is refused: the verifiers read it as dropout on the residual state (E0402)."""
    if c.get(key, 0.0):
        raise fail(f"dropout on the token embeddings ({key}={num(c.get(key))}) is not supported",
                   f"the language reads it as dropout on the residual state; set {key} to 0 (it acts only in "
                   "training)", at=(key,))
    return ""


def drop(p: float) -> Callable[[str], str]:
    """An update wrapped in its dropout, or left as it is where ``p`` is 0."""
    return (lambda e: f"dropout({e}, p={num(p)})") if p else (lambda e: e)
