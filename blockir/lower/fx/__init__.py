"""IR → a tree of torch.fx.GraphModules, built node by node from the ops (no tracing).

Every compiled block is a :class:`BlockModule` (an ``fx.GraphModule``, ``module.py``); its graph is
built by :class:`GraphBuilder` (``builder.py``) calling each op kind's lowering hook, the hooks
reaching torch through :class:`Runtime` (``runtime.py``, the functions generated code calls); the
module tree of declarations, sub-blocks and stacks is ``tree.py``, the in-place glue of inference
``inplace.py``. SSA names become node names (``names.py``); the mapping is kept on the module
(``blockir_values``) so :func:`blockir.trace` can return every intermediate by its IR name.

The forward's keyword arguments (``ctx``: masks, position embeddings) reach every branch,
sub-block, stack and bound extern: their ``call_module`` nodes carry the context under the keyword
``"**"``, which :class:`BlockCodeGen` prints as ``**context``; a bound extern calls
``adapter(module, *inputs, **ctx)``.
"""
from __future__ import annotations

from blockir.lower.fx.builder import FX, Backend
from blockir.lower.fx.module import CONTRACT_ATTR, BlockModule
from blockir.lower.fx.runtime import SEED_HIGH, SPLAT, dropout_site, inplace_add, site_id
from blockir.lower.fx.tree import Stack, lower_block

__all__ = ["FX", "Backend", "CONTRACT_ATTR", "BlockModule", "SEED_HIGH", "SPLAT", "dropout_site", "inplace_add",
           "site_id", "Stack", "lower_block"]
