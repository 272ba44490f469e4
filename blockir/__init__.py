"""blockir: a compiler for Transformer block topologies.

``compile``, ``trace``, ``reconcile`` and ``lift`` are imported on first use: ``compile``,
``trace`` and ``lift`` need torch, and none is needed by ``parse``/``load``/``verify`` or the checking
commands, which start without loading them.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from blockir.collector import gc_paused

# the parser, the IR and the libraries under them define thousands of objects and no garbage: collecting
# while they load would only rescan them
with gc_paused():
    from blockir.api import hf_block_text, load, parse, verify
    from blockir.diagnostics import BlockError, Diagnostic, Note, Span
    from blockir.ir.program import Program
    from blockir.signatures import public


@public("from_hf_config")
def from_hf_config(config: Any, exact: bool = False) -> Program:
    """The program of a transformers config (dict or config object): ``compile`` the class its ``architectures``
    names (by default its ``*ForCausalLM``); a config the importer cannot honour raises a located BlockError."""
    text = hf_block_text(config, exact)
    model_type = getattr(config, "model_type", None) or (config.get("model_type") if isinstance(config, dict) else None)
    return parse(text, f"<hf {model_type}>")

if TYPE_CHECKING:
    from blockir.analyses.keys import reconcile
    from blockir.lifecycle.calibrate import calibrate
    from blockir.lower.compile import compile
    from blockir.lower.distributed import parallelize
    from blockir.lower.layers.kv_cache import KVCache
    from blockir.lifecycle.pretrained import from_pretrained
    from blockir.lower.trace import trace
    from blockir.lift import lift

__version__ = "0.1.0"
__all__ = ["BlockError", "Diagnostic", "KVCache", "Note", "Span", "calibrate", "compile", "from_hf_config",
           "from_pretrained", "lift", "load", "parallelize", "parse",
           "reconcile", "trace", "verify",
           "__version__"]

_LAZY = {"compile": "blockir.lower.compile", "trace": "blockir.lower.trace", "reconcile": "blockir.analyses.keys",
         "parallelize": "blockir.lower.distributed", "calibrate": "blockir.lifecycle.calibrate",
         "lift": "blockir.lift", "from_pretrained": "blockir.lifecycle.pretrained", "KVCache": "blockir.lower.layers.kv_cache"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'blockir' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    # blockir.lift is its callable package, so that importing blockir.lift.… cannot rebind the name
    value = module if name == "lift" else getattr(module, name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
