"""Rewrites, IR to IR: inline, fuse, fold and the recipes, each a pass that runs through the manager
(:mod:`blockir.passes.manager`), which re-verifies the program after every pass that changed it."""
