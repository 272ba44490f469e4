"""Depth and normalization recipes (docs/recipes.md) as transforms: a program in, a new program and its init out.

Each recipe is ``apply(program, block_name, **options) -> RecipeResult(program, init, report)``:
the program is ordinary IR (it prints, parses back and verifies), ``init(module)`` sets what the IR
cannot state on a module compiled from it (None when the declarations carry the whole
initialisation; Admin's profiled init comes from :mod:`blockir.lifecycle.admin`), and the report
lists the constants, the changes and what the paper's contract needs beyond the graph. Each runs as
a pass through :mod:`blockir.passes.manager`, which verifies the program it returns.
"""
from __future__ import annotations

from typing import Callable

from blockir.passes.recipes import admin, deepnorm, deepscalelm, dyt_llm, fixup, layerscale, rezero, tfixup
from blockir.passes.recipes.base import RecipeError, RecipeResult, Report

RECIPES: dict[str, Callable[..., RecipeResult]] = {
    "deepnorm": deepnorm.apply,
    "rezero": rezero.apply,
    "layerscale": layerscale.apply,
    "tfixup": tfixup.apply,
    "admin": admin.apply,
    "fixup": fixup.apply,
    "deepscalelm": deepscalelm.apply,
    "dyt_llm": dyt_llm.apply,
}

__all__ = ["RECIPES", "RecipeError", "RecipeResult", "Report"]
