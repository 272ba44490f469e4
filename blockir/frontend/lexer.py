"""lark's contextual lexer with one scanner shared by every parser state.

The contextual lexer gives each parser state its own scanner: one regular expression joining the
terminals the state accepts, in lark's priority order, compiled the first time the state lexes.
A parse of a small file meets about thirty such states, and compiling their expressions was
about 6% of what a ``check`` runs besides importing lark and networkx. Here every state first asks one scanner over all terminals; when
the terminal it finds is one the state accepts, that is the state's own answer, because the
state's expression lists a subset of the same alternatives in the same order and an alternation
takes the first alternative that matches. Only otherwise (and to report an error) does a state
compile its own scanner, so what is lexed, and every error, is what the contextual lexer gives.

That argument holds while no literal is re-typed after the match (lark's "unless" callbacks, for
a keyword that a regular terminal also matches); a grammar that has one, or lexer callbacks,
keeps the per-state scanners.
"""
from __future__ import annotations

from typing import Any, Collection

from lark.common import LexerConf
from lark.lexer import BasicLexer, ContextualLexer


class _StateLexer(BasicLexer):
    """One parser state's lexer: tries the shared scanner first when its contextual lexer allows it."""

    shared: BasicLexer | None = None

    def __init__(self, conf: LexerConf, comparator: Any = None) -> None:
        super().__init__(conf, comparator)
        self.names = frozenset(t.name for t in self.terminals)
        self.callback: dict[str, Any] = {}  # set again when the state's own scanner is built

    def match(self, text: Any, pos: int) -> tuple[str, str] | None:
        if self.shared is not None and self._scanner is None:  # once built, the state's own scanner is as fast
            found = self.shared.match(text, pos)
            if found is not None and found[1] in self.names:
                return found
        return super().match(text, pos)


class SharedScannerLexer(ContextualLexer):
    """The contextual lexer whose states share the root lexer's scanner (see the module docstring)."""

    BasicLexer = _StateLexer

    def __init__(self, conf: LexerConf, states: dict[int, Collection[str]], always_accept: Collection[str] = ()) -> None:
        super().__init__(conf, states, always_accept)
        if _matches_literally(self.root_lexer, conf):
            for lexer in self.lexers.values():
                lexer.shared = self.root_lexer


def _matches_literally(root: BasicLexer, conf: LexerConf) -> bool:
    """Whether no token is re-typed after its match: no "unless" callback in the root's scanner (building
    it computes them) and no lexer callbacks. A lark whose lexers do not build their scanner lazily (the
    attributes read here) keeps its own per-state scanners."""
    if not isinstance(getattr(BasicLexer, "scanner", None), property) or not hasattr(root, "_scanner"):
        return False
    return root.scanner is not None and not root.callback and not conf.callbacks
