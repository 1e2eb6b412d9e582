"""FP8 GEMMs (Triton and Gluon), one place: the plain-Triton kernels (``kernels``: pointer and
TMA loads), the warp-specialized promoting Gluon kernel for Hopper (``gluon_ws``), the launcher
(``launch``: plans, the dispatch between them) and the tuning table (``tuning``)."""
from .launch import FP8Gemm, scale_geometry
from .tuning import GEMM_FP8_TUNING, WS_CONFIGS, GemmFP8Tuning, WSConfig

__all__ = ["FP8Gemm", "scale_geometry", "GemmFP8Tuning", "GEMM_FP8_TUNING", "WSConfig", "WS_CONFIGS"]
