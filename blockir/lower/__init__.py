"""Lowering: IR → torch modules (fx graphs, fused kernels, distributed plans) and the layers they call."""
