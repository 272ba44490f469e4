"""blockir: a compiler for Transformer block topologies."""
from blockir.analyses.keys import reconcile
from blockir.api import load, parse, verify
from blockir.backends.compile import compile
from blockir.backends.trace import trace
from blockir.diagnostics import BlockError, Diagnostic, Note, Span

__version__ = "0.1.0"
__all__ = ["BlockError", "Diagnostic", "Note", "Span", "compile", "load", "parse", "reconcile", "trace", "verify", "__version__"]
