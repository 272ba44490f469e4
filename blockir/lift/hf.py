"""A tiny random instance of an installed transformers family, and its first layer as the model calls it."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

class FamilyFailure(Exception):
    """transformers cannot build or run the family at the tiny sizes."""


HEADS, KV_HEADS, LAYERS, VOCAB = 4, 2, 2, 128


def _config(model_type: str, width: int) -> Any:
    from transformers import AutoConfig

    try:
        config = AutoConfig.for_model(model_type)
    except (ValueError, KeyError) as exc:
        raise LookupError(str(exc).splitlines()[0]) from None
    sizes = {"hidden_size": width, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
             "intermediate_size": 2 * width, "num_hidden_layers": LAYERS, "vocab_size": VOCAB,
             "head_dim": width // HEADS, "rotary_dim": width // HEADS, "max_position_embeddings": 128,
             "use_cache": False, "d_model": width, "d_ff": 2 * width, "d_kv": width // HEADS, "num_heads": HEADS,
             "num_layers": LAYERS, "num_decoder_layers": LAYERS, "ffn_dim": 2 * width}
    for key, value in sizes.items():
        if key in ("hidden_size", "vocab_size", "use_cache") or hasattr(config, key):
            try:
                setattr(config, key, value)
            except AttributeError:  # a derived size (Falcon's head_dim)
                pass
    config._attn_implementation = "eager"  # plain matmul and softmax: deterministic on every device
    return config


def _model(model_type: str, width: int) -> tuple[nn.Module, Any]:
    from transformers import AutoModel, AutoModelForCausalLM

    config = _config(model_type, width)
    torch.manual_seed(0)
    try:
        model = AutoModelForCausalLM.from_config(config)
    except ValueError:
        model = AutoModel.from_config(config)
    return model.eval(), config


def hf_layer(model_type: str, batch: int, seq: int, width: int) -> tuple[nn.Module, tuple[tuple, dict]]:
    """The model's first layer and the arguments the model passes it on random token ids.

    Raises LookupError for a model type transformers does not know, and FamilyFailure when the
    family cannot be built or run at the tiny sizes.
    """
    try:
        model, config = _model(model_type, width)
    except LookupError:
        raise
    except Exception as exc:  # transformers' own code at sizes it may not support
        raise FamilyFailure(f"building a tiny {model_type} fails: {type(exc).__name__}: {exc}") from None
    layers = next((m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) == LAYERS), None)
    if layers is None:
        raise LookupError(f"the {model_type} model has no list of {LAYERS} layers")
    seen: dict[str, Any] = {}

    def hook(m: nn.Module, args: tuple, kwargs: dict) -> None:
        seen.setdefault("call", (args, kwargs))
    handle = layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(0))
    extra = {"decoder_input_ids": ids} if getattr(config, "is_encoder_decoder", False) else {}
    try:
        with torch.no_grad():
            model(input_ids=ids, **extra)
    except Exception as exc:  # transformers' own code at sizes it may not support
        raise FamilyFailure(f"running a tiny {model_type} fails: {type(exc).__name__}: {exc}") from None
    finally:
        handle.remove()
    return layers[0], seen["call"]
