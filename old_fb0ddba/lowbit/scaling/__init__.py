"""Scaling recipes (frozen dataclasses) and scale computation per granularity."""
from .blocks import ROW, TENSOR, Block, block_amax, expand_scale
from .delayed import DelayedScalingState
from .recipes import MX, NV, ROLES, Blockwise, Current, Delayed, FP8Recipe, Recipe, Rowwise
from .scales import amax_to_scale, mx_scale, nv_block_scale, nv_global_scale

__all__ = ["Recipe", "FP8Recipe", "Delayed", "Current", "Rowwise", "Blockwise", "MX", "NV", "ROLES",
           "Block", "TENSOR", "ROW", "block_amax", "expand_scale", "DelayedScalingState",
           "amax_to_scale", "mx_scale", "nv_block_scale", "nv_global_scale"]
