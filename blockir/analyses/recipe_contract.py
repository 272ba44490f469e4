"""The recipe contract of a block: the seven fields that make a depth or normalization method reproducible.

A method is not its residual equation: the ordered graph, the branch count and
depth convention, the parameter initialisation, the new learned state, the
optimizer / warmup / regularization assumptions, the training-time profiling
and the inference-time reparameterization together are the recipe. Three
fields are read from the program (the graph, the counts, the stated
initialisation and learned state, whose values the manifest's
``initialisation`` lists); the other four are what the method's
source assumes, stated per recipe below, because a file cannot carry them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blockir.analyses.keys import fixup_biases
from blockir.analyses.manifest_training import initialisation
from blockir.analyses.sizes import Env
from blockir.analyses.structure import wrapper
from blockir.ir.decls import KindDecl
from blockir.ir.program import Block
from blockir.norms.dyt import FAMILY as DYT

FIELDS = ("ordered_graph", "branch_count_and_depth", "parameter_initialization", "new_learned_state",
          "optimizer_warmup_regularization", "training_time_profiling", "inference_time_reparameterization")


@dataclass(frozen=True)
class Source:
    """The parts of a recipe's contract its source states and the graph cannot."""

    name: str
    depth: str  # what the method counts as its depth
    init: str  # its initialisation rule
    optimizer: str  # optimizer, warmup and regularization assumptions
    profiling: str
    inference: str


SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("Pre-LN", "L layers, one update per branch", "the model's ordinary initialisation",
           "the model's own recipe", "none", "the norms stay"),
    Source("Post-LN", "L layers, a norm on every residual sum", "the model's ordinary initialisation",
           "the model's own recipe; Post-LN is sensitive to learning-rate warmup (Xiong et al., 2020)", "none",
           "the norms stay"),
    Source("Peri-LN", "L layers, two norms per branch (input and output) plus the stack-boundary norms",
           "the model's ordinary initialisation", "the source's recipe (models up to 3.2B parameters)", "none",
           "both norms per branch stay; an embedding norm and the final norm are part of the contract"),
    Source("ReZero", "one scalar gate per residual branch", "the gate starts at zero",
           "the gate starts at zero; the paper's setup removes the norms", "none", "the gate remains or is folded"),
    Source("LayerScale", "one channel gain per branch, ε by depth (CaiT)", "every channel gain starts at ε",
           "Pre-LN, warmup and the vision recipe are retained", "none",
           "the diagonal gain remains or folds into the output projection"),
    Source("Fixup", "L residual branches of m weight layers", "last layer zero, earlier layers × L^(-1/(2m-2))",
           "the full initialisation and regularization recipe, no norms", "none",
           "the added scalar multipliers and biases remain or fold"),
    Source("T-Fixup", "encoder and decoder layer counts", "paper-specific NMT scaling of the matrices",
           "no warmup; no norms", "none", "an ordinary linear graph with trained scaled weights"),
    Source("Admin", "the Post-LN layers whose outputs are profiled",
           "standard initialisation, then ω from the profile",
           "standard training after the profile and reinitialisation", "a profile pass on data sets the shortcut "
           "vectors ω_i", "the paper gives a module-specific exact fold"),
    Source("DeepNorm", "N (encoder) and M (decoder) layers, by architecture row",
           "Xavier with gain β on the value, output and MLP matrices; q and k gain 1",
           "architecture-specific α and β on the selected matrices", "none",
           "the scaled shortcut remains unless folded"),
    Source("DeepScaleLM", "N layers, λ² + β² = 1 with β² = 2/N",
           "component moment initialisation (N(0, 1/fan_in)) and residual scaling",
           "the source's moment-preserving recipe", "an analytic correlation model, not a profile pass",
           "the paper gives a weight and norm fold"),
    Source("NormFormer", "L layers of the expanded Pre-LN graph", "the model's ordinary initialisation",
           "paper-specific learning-rate tuning and compute matching", "none",
           "the extra norms, head scales and their checkpoint keys remain"),
    Source("DyT", "every norm site replaced by DyT", "α by width and site (LLMs), 0.5 elsewhere",
           "the model family's own recipe", "none", "DyT stays an elementwise op"),
    Source("nGPT", "L layers on the hypersphere, eigen-rates α per update", "matrices start on the unit sphere",
           "no weight decay and no learning-rate warmup; the projection after each step", "none",
           "normalized matrices and scales remain"),
)}

TOPOLOGY = {"pre_ln": "Pre-LN", "post_ln": "Post-LN", "peri_ln": "Peri-LN", "rezero": "ReZero",
            "layerscale": "LayerScale", "fixup": "Fixup", "deepscalelm": "DeepScaleLM", "normformer": "NormFormer",
            DYT.name: "DyT", "ngpt": "nGPT"}


def recipe_name(topology: str, block: Block) -> str | None:
    """The recipe a classified block follows; a constant shortcut on Post-LN sums is DeepNorm."""
    if topology == "scaled_residual":
        return "DeepNorm" if any(s.post_norm is not None for s in wrapper(block).sublayers) else None
    return TOPOLOGY.get(topology)


def _learned(block: Block) -> list[dict[str, Any]]:
    out = [{"decl": d.name, "kind": d.kind} for d in block.decls if isinstance(d, KindDecl)
           and (d.category in ("scale", "shift") or d.kind == DYT.name)]
    # Fixup's scalar biases inside built-in branches are the branch module's own keys
    return out + [{"decl": f"{d.name}.{key}", "kind": "bias"} for d in block.decls if isinstance(d, KindDecl)
                  for key in fixup_biases(d)]


# the recipes `blockir recipe` applies, by their command-line names
CLI_NAMES = {"deepnorm": "DeepNorm", "rezero": "ReZero", "layerscale": "LayerScale", "tfixup": "T-Fixup",
             "fixup": "Fixup", "deepscalelm": "DeepScaleLM", "dyt_llm": "DyT", "admin": "Admin"}


def recipe_contract(block: Block, topology: str, equation: str, branch_order: list[str], layers: int | None,
                    env: Env, recipe: str | None = None) -> dict[str, Any] | None:
    """The seven fields for ``block`` under ``recipe`` (default: the recipe its topology names), or None when
    its topology is no recipe."""
    name = recipe or recipe_name(topology, block)
    if name is None:
        return None
    src = SOURCES[name]
    return {"recipe": name,
            "ordered_graph": {"equation": equation, "branch_order": branch_order},
            "branch_count_and_depth": {"branches_per_layer": len(branch_order), "layers": layers,
                                       "convention": src.depth},
            "parameter_initialization": {"rule": src.init,
                                         "stated_by": [i["decl"] for i in initialisation(block, env)]},
            "new_learned_state": _learned(block),
            "optimizer_warmup_regularization": src.optimizer,
            "training_time_profiling": src.profiling,
            "inference_time_reparameterization": src.inference}
