"""Admin's profiled initialisation (Liu et al., 2020): the run that measures each branch's output variance.

The recipe (:mod:`blockir.passes.recipes.admin`) writes the graph, with every shortcut vector omega at 1,
names the sites and turns measured variances into omegas. ``init(module)`` here is the measurement: it
sets every omega to 1, runs the calibration batch forward once in eval mode through
:func:`blockir.trace`, and writes ``omega_i = sqrt(Var(x_0) + sum_{j<i} Var(F_j))``; ``init.fold(module)``
folds trained omegas back into the weights. See docs/recipes.md.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

import torch

from blockir.ir.program import Program
from blockir.lifecycle.session import random_inputs
from blockir.lower.trace import trace
from blockir.passes.recipes import admin
from blockir.passes.recipes.admin import Profile, Site, omegas
from blockir.passes.recipes.base import RecipeResult


def apply(program: Program, block_name: str, *, model: str | None = None, inputs: Sequence[Any] | None = None,
          dims: Mapping[str, int] | None = None, seed: int = 0, ctx: Mapping[str, Any] | None = None
          ) -> RecipeResult:
    """Admin on ``block_name`` with the init that profiles a module compiled from ``model`` (default: the
    model that stacks the block, else the block itself).

    The calibration batch is ``inputs`` (the target's inputs, in order), or standard-normal inputs drawn
    with ``seed`` at ``dims``; ``ctx`` is passed to the branches during the profile.
    """
    result = admin.apply(program, block_name, model=model)
    target, sites = admin.plan(result.program, block_name, model)
    return replace(result, init=AdminInit(result.program, target, sites, inputs, dims or {}, seed, ctx or {}))


class AdminInit:
    """``init(module)`` profiles and sets omega; ``fold(module)`` folds trained omegas back into weights."""

    def __init__(self, program: Program, target: str, sites: tuple[Site, ...],
                 inputs: Sequence[Any] | None, dims: Mapping[str, int], seed: int, ctx: Mapping[str, Any]):
        self.program = program
        self.target = target
        self.sites = sites
        self._inputs = inputs
        self._dims = dict(dims)
        self._seed = seed
        self._ctx = dict(ctx)
        self.profile: Profile | None = None

    def _check(self, module: Any) -> None:
        if getattr(module, "blockir_block", None) != self.target:
            raise ValueError(f"Admin's init expects a module compiled from '{self.target}', got "
                             f"{getattr(module, 'blockir_block', type(module).__name__)!r}")

    def _calibration(self, module: Any) -> list[Any]:
        dtype = next(module.parameters()).dtype
        if self._inputs is not None:
            return [t.to(dtype) for t in self._inputs]
        gen = torch.Generator().manual_seed(self._seed)
        return [t.to(dtype) for t in random_inputs(self.program, self.program.block(self.target), self._dims, gen)]

    def __call__(self, module: Any) -> None:
        self._check(module)
        inputs = self._calibration(module)
        params = [module.get_parameter(s.omega) for s in self.sites]
        was_training = module.training
        with torch.no_grad():
            for p in params:
                p.fill_(1.0)
            module.eval()
            _, values = trace(module, *inputs, **self._ctx)
            module.train(was_training)
            variances = tuple(values[s.branch].double().var(unbiased=False).item() for s in self.sites)
            x0 = inputs[0].double().var(unbiased=False).item()
            omega = omegas(x0, variances)
            for p, w in zip(params, omega):
                p.fill_(w)
        self.profile = Profile(x0, variances, omega, inputs[0].numel() // inputs[0].shape[-1])

    def fold(self, module: Any) -> list[str]:
        """Fold every foldable omega into the previous norm and the branch's first linears (after training);
        returns the omega paths folded. The module computes the same function; folded omegas become 1."""
        self._check(module)
        folded = []
        with torch.no_grad():
            for s in self.sites:
                if s.reason is not None:
                    continue
                omega = module.get_parameter(s.omega)
                _scale_norm(module.get_submodule(s.norm), omega)
                for path in s.linears:
                    weight = module.get_submodule(path).weight
                    weight.copy_(weight / omega.to(weight.dtype))
                omega.fill_(1.0)
                folded.append(s.omega)
        return folded


def _scale_norm(norm: Any, omega: Any) -> None:
    """omega * norm(x) as the same norm with scaled affine state."""
    weight, bias = norm.param("weight"), norm.param("bias")
    w = omega.to(weight.dtype)
    if getattr(norm, "offset", 0):  # (1 + weight) * omega = 1 + weight'
        weight.copy_((1 + weight) * w - 1)
    else:
        weight.copy_(weight * w)
    if bias is not None:
        bias.copy_(bias * w)
