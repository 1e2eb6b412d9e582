"""Scaling recipes (frozen dataclasses) and scale computation per granularity."""
from ..dtypes.blocks import ROW, TENSOR, Block, block_amax, expand_scale
from .attention import AttentionRecipe
from .delayed import DelayedScalingState
from .recipes import MX, NV, ROLES, Blockwise, Current, Delayed, FP8Recipe, Recipe, Rowwise
from .scales import amax_to_scale, mx_scale, nv_block_scale, nv_global_scale

__all__ = ["AttentionRecipe", "Recipe", "FP8Recipe", "Delayed", "Current", "Rowwise", "Blockwise", "MX", "NV", "ROLES",
           "Block", "TENSOR", "ROW", "block_amax", "expand_scale", "DelayedScalingState",
           "amax_to_scale", "mx_scale", "nv_block_scale", "nv_global_scale"]
