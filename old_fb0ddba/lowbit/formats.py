"""Public alias of ``lowbit.dtypes.formats``: ``lowbit.formats.E4M3`` etc."""
from .dtypes.formats import (BF16, E2M1, E4M3, E5M2, E8M0, FORMATS, FP16, FP32, UE4M3,  # noqa: F401
                             Format, get_format)

__all__ = ["Format", "get_format", "FORMATS", "E4M3", "E5M2", "E2M1", "E8M0", "UE4M3", "FP16", "BF16", "FP32"]
