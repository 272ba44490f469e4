"""The architecture part of a release manifest: which function a released artifact computes.

A name ("Llama", "Pre-LN") does not select a function; the fields here do: topology and branch
order, the final norm, the norm family with its axes, epsilon and accumulation dtype, the residual
dtype, branch dropout and the scaling recipe. They are read from the block manifest (which the
release embeds whole), for the layer a model stacks.
"""
from __future__ import annotations

from typing import Any

from blockir.analyses.classify import RECIPES
from blockir.analyses.manifest import program_manifest
from blockir.analyses.summaries import summaries
from blockir.ir.decls import InstanceDecl
from blockir.ir.program import Program


def _callees(program: Program, name: str) -> list[str]:
    seen, todo = [name], [name]
    while todo:
        for d in program.block(todo.pop()).decls:
            if isinstance(d, InstanceDecl) and d.block in program.block_map and d.block not in seen:
                seen.append(d.block)
                todo.append(d.block)
    return seen


def _values(items: list[Any]) -> Any:
    distinct: list[Any] = []
    for v in items:
        if v not in distinct:
            distinct.append(v)
    return distinct[0] if len(distinct) == 1 else distinct


def architecture(program: Program, name: str) -> dict[str, Any]:
    """``architecture``, ``normalization`` and ``residual`` sections, and the block manifest they come from."""
    blocks = _callees(program, name)
    manifest = program_manifest(program, [b for b in program.blocks if b.name in blocks])
    top = manifest["blocks"][name]
    layer = manifest["blocks"][top["layers"][0]["block"]] if top.get("layers") else top
    final = top.get("final_norm")
    sites = list(layer.get("norm_sites") or []) + ([final] if final else [])
    updates = [u for sub in layer.get("residual", {}).get("updates", []) for u in sub]
    scales = [s for s in layer.get("residual", {}).get("shortcut_scale", [])] + [u["scale"] for u in updates]
    drops = [u["dropout"]["p"] if isinstance(u["dropout"], dict) else u["dropout"] for u in updates]
    recipe = layer["topology"] if layer["topology"] in RECIPES and layer["topology"] not in ("mixed", "custom") \
        else ("baseline" if all(s == 1.0 for s in scales) else "custom scales")
    return {
        "architecture": {"block": name, "topology": layer["topology"], "branch_order": layer.get("branch_order", []),
                         "layers": sum(m["count"] for m in top.get("layers", [])) or 1,
                         "final_norm": summaries(program)[name].ends_normalized},
        "normalization": {"family": _values([s["family"] for s in sites]) if sites else None,
                          "axes": _values([s["reduction_axes"] for s in sites]) if sites else None,
                          "epsilon": _values([s["epsilon"] for s in sites]) if sites else None,
                          "work_dtype": _values([s["accum"] or "input dtype" for s in sites]) if sites else None},
        "residual": {"dtype": layer["state"]["dtype"] or "parameter dtype (f32)",
                     "dropout_probability": _values(drops) if drops else 0.0,
                     "scaling_recipe": recipe},
        "manifest": manifest,
    }
