"""Scale granularity (``Block``) and block amax: defined in ``lowbit.dtypes.blocks``, where the
tensor subclasses find them without importing the recipes; re-exported here for the recipes'
users."""
from ..dtypes.blocks import ROW, TENSOR, Block, block_amax, block_any, expand_scale, finite_abs

__all__ = ["Block", "TENSOR", "ROW", "block_amax", "block_any", "expand_scale", "finite_abs"]
