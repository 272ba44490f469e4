"""blockir: a compiler for Transformer block topologies."""
from blockir.api import load, parse, verify
from blockir.diagnostics import BlockError, Diagnostic, Note, Span

__version__ = "0.1.0"
__all__ = ["BlockError", "Diagnostic", "Note", "Span", "load", "parse", "verify", "__version__"]
