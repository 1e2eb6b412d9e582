"""One profiled call of each FP8 GEMM variant (lowbit's and its cuBLAS anchor), for Nsight Compute (GPU).

    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \\
        python3 benchmarks/gemm_ncu.py [--shape 8192x8192x8192] [--modes tensorwise,blockwise,blockwise_cols]
                                       [--configs ws_s3_g16_eo,...]

Every variant of ``gemm_ab.variants`` (the anchor first, then the named ``gemm_gluon_ws``
configurations; default: what ``promote_config`` dispatches) is called three times to compile and
warm up, then once between ``cudaProfilerStart`` / ``cudaProfilerStop``: with
``--profile-from-start off`` Nsight Compute profiles exactly those launches (cuBLAS blockwise
may add its scale-layout kernels). The order of the profiled calls is printed, so the report's
kernels can be named.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.gemm_ab import operands, variants  # noqa: E402
from lowbit.kernels.triton.gemm_fp8 import GEMM_FP8_TUNING, WS_CONFIGS  # noqa: E402


def promote_config(M, N, mode):
    """The name of the configuration the dispatcher gives an (M, N) output in ``mode``."""
    cfg = GEMM_FP8_TUNING.ws_config(M, N, mode)
    return next(n for n, c in WS_CONFIGS.items() if c == cfg)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="8192x8192x8192")
    p.add_argument("--modes", default="tensorwise,blockwise,blockwise_cols")
    p.add_argument("--configs", default="", help="WS_CONFIGS names (default: the dispatcher's)")
    args = p.parse_args()
    M, N, K = (int(n) for n in args.shape.split("x"))
    cudart = torch.cuda.cudart()
    order = []
    for mode in args.modes.split(","):
        configs = [c for c in args.configs.split(",") if c] or [promote_config(M, N, mode)]
        a, b = operands(mode, M, N, K, seed=7)
        for name, fn in variants(mode, a, b, configs):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            cudart.cudaProfilerStart()
            fn()
            torch.cuda.synchronize()
            cudart.cudaProfilerStop()
            order.append(f"{mode}: {name}")
    print("profiled, in order:\n  " + "\n  ".join(order))


if __name__ == "__main__":
    main()
