"""lowbit: numerics-aware FP8/FP4 training for PyTorch.

Public API: ``formats``, ``recipes`` (``lowbit.scaling``), ``FP8Tensor``, ``FP4Tensor``,
``convert`` / ``unconvert`` / ``plain_state_dict`` (module swap, ``lowbit/convert.py``; the name
``lowbit.convert`` is the function: import helpers with ``from lowbit.convert import ...``),
``nn`` (the low-precision layers); ``monitor`` arrives with its issue.
"""
from . import formats
from . import scaling
from . import scaling as recipes
from .dtypes import FP4Tensor, FP8Tensor
from . import kernels  # noqa: F401  (registers the backends and the mm route)
from . import nn
from .convert import convert, plain_state_dict, unconvert

__version__ = "0.1.0"

__all__ = ["formats", "recipes", "scaling", "FP8Tensor", "FP4Tensor", "convert", "unconvert",
           "plain_state_dict", "nn", "__version__"]
