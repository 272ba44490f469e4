"""Public functions refuse a call their signature does not take with E0722, not Python's TypeError.

``@public("compile")`` reads the function's signature once; each call then checks that every keyword
is a parameter (with a did-you-mean for a misspelt one), that there are not too many positional
arguments and that every required one is given, before the function runs.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, TypeVar

from blockir.diagnostics import BlockError, argument_error
from blockir.frontend.scope import suggest

F = TypeVar("F", bound=Callable[..., Any])


def public(name: str) -> Callable[[F], F]:
    """Check calls of ``blockir.<name>`` against its signature; the wrapped function keeps its signature."""

    def wrap(fn: F) -> F:
        params = list(inspect.signature(fn).parameters.values())
        named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        keywords = frozenset(named)
        any_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
        positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        any_positional = any(p.kind is p.VAR_POSITIONAL for p in params)
        required = [(i, p.name) for i, p in enumerate(params) if p.default is p.empty
                    and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        takes = f"blockir.{name} takes: {', '.join(named)}"

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not any_keyword:
                for key in kwargs:
                    if key not in keywords:
                        hint = " ".join(filter(None, (suggest(key, named), takes)))
                        raise BlockError([argument_error(name, key, f"blockir.{name} takes no argument '{key}'",
                                                         hint)])
            if len(args) > len(positional) and not any_positional:
                raise BlockError([argument_error(name, positional[-1] if positional else "…",
                                                 f"blockir.{name} takes at most {len(positional)} positional "
                                                 f"arguments ({', '.join(positional)}), got {len(args)}",
                                                 "pass the others by keyword: " + takes)])
            for index, arg in required:
                if index >= len(args) and arg not in kwargs:
                    raise BlockError([argument_error(name, arg, f"blockir.{name} needs the argument '{arg}'",
                                                     takes)])
            return fn(*args, **kwargs)
        return call  # type: ignore[return-value]
    return wrap
