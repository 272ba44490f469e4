"""Python identifiers for IR names: the node names of a graph and the parameters of its forward."""
from __future__ import annotations

import builtins
import keyword

from blockir.ir.program import Block

_OWN_NAMES = frozenset({"self", "ctx"})
# globals the generated code may refer to, besides builtins; a parameter must not shadow them
_CODE_GLOBALS = frozenset({"torch", "inf", "nan", "device", "fx_pytree", "pytree", "NoneType", "operator"})


def node_name(ssa: str) -> str:
    """A Python identifier for an SSA name: %3 → t3, and inlined layers.0.%3 → layers_0_t3.

    fx makes the name unique and renames Python keywords and builtins; names the generated
    forward uses itself (``self``, ``ctx``) get a trailing underscore.
    """
    *path, leaf = ssa.split(".")
    leaf = f"t{leaf[1:]}" if leaf.startswith("%") else leaf
    name = "_".join([*path, leaf])
    return f"{name}_" if name in _OWN_NAMES else name


def parameter_names(block: Block) -> list[str]:
    """The forward's parameter names: the input names, made safe Python identifiers and unique.

    A name that is a keyword, a builtin, a global of the generated code or ``self``/``ctx``
    gets a trailing underscore (``class`` → ``class_``); IR names and traces keep the input's name.
    """
    out: list[str] = []
    for op in block.inputs:
        name = op.result.replace(".", "_")
        if keyword.iskeyword(name) or name in vars(builtins) or name in _OWN_NAMES or name in _CODE_GLOBALS \
                or name.startswith("__"):
            name = f"{name.strip('_') or 'input'}_"
        while name in out:
            name += "_"
        out.append(name)
    return out
