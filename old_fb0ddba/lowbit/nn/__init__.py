"""Low-precision training modules: ``Linear`` (and ``TransposedLinear`` for Hugging Face's Conv1D
layout), the functional ``linear`` behind them, and their recipe state ``LinearState``.
Importing this package registers the ``torch.ops.lowbit.*`` custom ops the layers run on.
"""
from . import ops  # noqa: F401  (registers torch.ops.lowbit.*)
from .functional import linear
from .linear import STATE_NAME, Linear, LowbitModule, TransposedLinear, is_hf_conv1d, is_state_key
from .state import LinearState

__all__ = ["Linear", "TransposedLinear", "LowbitModule", "LinearState", "linear", "is_state_key",
           "is_hf_conv1d", "STATE_NAME"]
