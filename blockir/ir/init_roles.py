"""Which layers of a built-in branch each per-role init argument reaches.

A branch's update path is the chain of weight layers its output depends on
linearly through the values: V then O for attention (Q and K only form the
mixing weights), the input layer(s) then the output layer for an MLP. The
backend's module factory and the recipes that write these arguments both read
this table, so the roles a recipe means and the layers the backend touches
cannot drift apart.
"""
from __future__ import annotations

# init_gain: Xavier-normal with the gain on these roles ...
GAINED = {"self_attention": ("v", "o"), "cross_attention": ("v", "o"),
          "mlp": ("fc1", "fc2"), "gated_mlp": ("gate", "up", "down")}
# ... and Xavier-normal with gain 1 on these
UNGAINED = {"self_attention": ("q", "k"), "cross_attention": ("q", "k")}
# init_zero: the last weight layer on the update path (weight and bias start at zero)
LAST = {"self_attention": "o", "cross_attention": "o", "mlp": "fc2", "gated_mlp": "down"}
# init_scale: the layers before the last on the update path (a fused gate_up holds gate and up, both on it)
EARLIER = {"self_attention": ("v",), "cross_attention": ("v",), "mlp": ("fc1",), "gated_mlp": ("gate", "up", "gate_up")}
# init_std=fan_in: these draw N(0, 2/fan_in), a rectifier halving the second moment; every other matrix N(0, 1/fan_in)
RECTIFIED = {"mlp": ("fc1",), "gated_mlp": ("gate", "up", "gate_up")}
# weight layers along the update path of every built-in branch (Fixup's m)
PATH_LAYERS = 2
