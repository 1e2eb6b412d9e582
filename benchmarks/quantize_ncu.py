"""A few calls of one fused quantize variant, for Nsight Compute to read its kernels' counters (GPU).

    ncu --clock-control none --kernel-name regex:_cast_cols_t --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats python3 benchmarks/quantize_ncu.py \\
        --variant "block 1x128 +T" [--set cols_t_warps=1] [--shape 8192x8192]

``--set`` overrides a field of the cast tuning table (``CastTuning``), as
``benchmarks/quantize_sass.py`` does. The input is bf16 ``randn``.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.quantize import make_calls, variants  # noqa: E402
from lowbit.kernels.triton import make_backend  # noqa: E402
from lowbit.kernels.triton.cast_fp8 import CAST_TUNING  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", required=True, help="a variant of benchmarks/quantize.py")
    p.add_argument("--shape", default="8192x8192")
    p.add_argument("--set", action="append", default=[], help="CastTuning field=value (repeatable)")
    p.add_argument("--calls", type=int, default=4)
    args = p.parse_args()
    changes = {}
    for s in args.set:
        attr, val = s.split("=")
        changes[attr] = eval(val)  # noqa: S307 - a developer's command line
    be = make_backend(cast_tuning=CAST_TUNING.override(**changes))
    variant = {v[0]: v for v in variants()}[args.variant]
    x = torch.randn(tuple(int(n) for n in args.shape.split("x")), device="cuda", dtype=torch.bfloat16)
    fn = make_calls(*variant, x, be)[0]
    for _ in range(args.calls):
        fn()
    torch.cuda.synchronize()
    print(f"{args.variant} {args.shape} {args.set}: {args.calls} calls")


if __name__ == "__main__":
    main()
