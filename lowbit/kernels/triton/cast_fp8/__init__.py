"""FP8 casts (Triton), one place: the kernels by granularity (``tensorwise``, ``rowwise``,
``blocks``, ``rowlocal``: the row-local walk of rowwise and 1xBC blocks, ``cols_t``: the
transposed copy alone, ``encode``: the shared encode helpers), the launcher (``launch``: plans and
launches) and the tuning table (``tuning``)."""
from .launch import FP8Casts
from .tuning import CAST_TUNING, CastTuning

__all__ = ["FP8Casts", "CastTuning", "CAST_TUNING"]
