"""lowbit: numerics-aware FP8/FP4 training for PyTorch.

Public API: ``formats``, ``recipes`` (``lowbit.scaling``), ``FP8Tensor``, ``FP4Tensor``;
``convert`` and ``monitor`` arrive with their issues.
"""
from . import formats
from . import scaling
from . import scaling as recipes
from .dtypes import FP4Tensor, FP8Tensor
from . import kernels  # noqa: F401  (registers the backends and the mm route)

__version__ = "0.1.0"

__all__ = ["formats", "recipes", "scaling", "FP8Tensor", "FP4Tensor", "__version__"]
