"""blockir: a compiler for Transformer block topologies.

``compile``, ``trace`` and ``reconcile`` are imported on first use: the first two
need torch, and none is needed by ``parse``/``load``/``verify`` or the checking
commands, which start without loading them.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from blockir.api import load, parse, verify
from blockir.diagnostics import BlockError, Diagnostic, Note, Span
from blockir.ir.program import Program


def from_hf_config(config: Any, exact: bool = False) -> Program:
    """The program of a transformers config (dict or config object): ``compile`` its ``*ForCausalLM`` model."""
    from blockir.importers.hf import block_text
    return parse(block_text(config, exact), f"<hf {getattr(config, 'model_type', None) or config.get('model_type')}>")

if TYPE_CHECKING:
    from blockir.analyses.keys import reconcile
    from blockir.backends.calibrate import calibrate
    from blockir.backends.compile import compile
    from blockir.backends.distributed import parallelize
    from blockir.backends.kv_cache import KVCache
    from blockir.backends.pretrained import from_pretrained
    from blockir.backends.trace import trace

__version__ = "0.1.0"
__all__ = ["BlockError", "Diagnostic", "KVCache", "Note", "Span", "calibrate", "compile", "from_hf_config", "from_pretrained",
           "load", "parallelize", "parse",
           "reconcile", "trace", "verify",
           "__version__"]

_LAZY = {"compile": "blockir.backends.compile", "trace": "blockir.backends.trace", "reconcile": "blockir.analyses.keys",
         "parallelize": "blockir.backends.distributed", "calibrate": "blockir.backends.calibrate",
         "from_pretrained": "blockir.backends.pretrained", "KVCache": "blockir.backends.kv_cache"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'blockir' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
