"""A few calls of the weight-only FP4 kernels at one shape, for Nsight Compute to read their counters (GPU).

    ncu --clock-control none --kernel-name regex:_wo --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section WarpStateStats --section Occupancy \\
        python3 benchmarks/fp4_weight_only_ncu.py [--shape 16x8192x8192]

Runs the weight-only GEMM (``scaled_mm``, its default configuration at M <= 16) ``--calls`` times on an NVFP4
(16x16 blocks) weight of ``randn * 0.02``.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lowbit.dtypes import FP4Tensor  # noqa: E402
from lowbit.kernels import scaled_mm  # noqa: E402
from lowbit.scaling import NV  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="16x8192x8192")
    p.add_argument("--calls", type=int, default=4)
    args = p.parse_args()
    M, N, K = (int(n) for n in args.shape.split("x"))
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = FP4Tensor.from_float((torch.randn(N, K, device="cuda") * 0.02).to(torch.bfloat16), NV(), "weight").t()
    for _ in range(args.calls):
        scaled_mm(x, b, torch.bfloat16)
    torch.cuda.synchronize()
    print("done")


if __name__ == "__main__":
    main()
