"""Host (CPU) time per call of lowbit's GPU entry points against torch's, on tiny shapes where the
GPU work is negligible: what an eager step pays in Python before its kernels reach the GPU.

    python benchmarks/host_overhead.py --out DIR [--calls 500] [--cprofile]

Each row: ``calls`` back-to-back calls (no synchronization in between, one at the end), wall time
/ calls, after 20 warm-up calls (compiled, autotuned). Anchors: bf16 ``torch.mm``, cuBLAS
``torch._scaled_mm``. Rows: ``fp8_scaled_mm`` (promoting Gluon default, fast-accum plain Triton,
``variant="triton"``), the fused casts (delayed e4m3 with the transposed copy, current e4m3), and a
converted ``nn.Linear`` forward + backward (fp8, delayed). A table last; DIR/host_overhead.json.
``--cprofile``: also cProfile 200 calls of the GEMM, the cast and the Linear step
(DIR/host_cprofile.txt, by own time and by cumulative time).
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.common import env_info, guarded, host_cprofile, parse_args, print_table, write_json  # noqa: E402


def per_call_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def write_cprofile(path: str, cases, calls: int = 200) -> None:
    with open(path, "w") as f:
        for name, fn in cases:
            f.write(f"==== {name}: {calls} calls\n{host_cprofile(fn, calls)}\n")


def main():
    def extra(p):
        p.add_argument("--calls", type=int, default=500)
        p.add_argument("--cprofile", action="store_true")
    args = parse_args(__doc__.splitlines()[0], extra)
    import lowbit
    from lowbit.dtypes import FP8Tensor
    from lowbit.kernels.gemm import fp8_scaled_mm
    from lowbit.kernels.quantize import quantize_fp8_t_triton, quantize_fp8_triton
    from lowbit.scaling import Current, Delayed
    from lowbit.scaling.delayed import DelayedScalingState
    dev = "cuda"
    M = N = K = 256
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
    a = FP8Tensor.from_float(x.float(), Current(), "input")
    b = FP8Tensor.from_float(w.float(), Current(), "weight").t()
    st = DelayedScalingState(Delayed(), Delayed().format("input")).to(dev)
    lin = lowbit.convert(torch.nn.Sequential(torch.nn.Linear(K, N, bias=False)).to(dev, torch.bfloat16), "fp8",
                         filter=lambda n, m: True)
    xg = x.clone().requires_grad_(True)

    def linear_step():
        xg.grad = None
        lin(xg).sum().backward()

    cases = [
        ("torch.mm bf16", lambda: torch.mm(x, w.t())),
        ("torch._scaled_mm (cuBLAS)", lambda: torch._scaled_mm(a._data, b._data, a._scale, b._scale,
                                                               out_dtype=torch.bfloat16)),
        ("fp8_scaled_mm promoting (auto: Gluon WS)", lambda: fp8_scaled_mm(a, b, torch.bfloat16)),
        ("fp8_scaled_mm fast-accum (plain Triton)", lambda: fp8_scaled_mm(a, b, torch.bfloat16, fast_accum=True)),
        ("fp8_scaled_mm variant=triton", lambda: fp8_scaled_mm(a, b, torch.bfloat16, variant="triton")),
        ("quantize delayed e4m3 +T", lambda: quantize_fp8_t_triton(x, Delayed(), "input", st)),
        ("quantize current e4m3", lambda: quantize_fp8_triton(x, Current(), "input")),
        ("lowbit fp8 Linear fwd+bwd", linear_step),
    ]
    rows, errors = [], []
    for name, fn in cases:
        us = guarded(errors, name, lambda fn=fn: per_call_us(fn, args.calls))
        if us is not None:
            rows.append({"call": name, "host_us": us})
            print(f"{name}: {us:.1f} us", flush=True)
    if args.cprofile:
        write_cprofile(os.path.join(args.out, "host_cprofile.txt"),
                       [(n, f) for n, f in cases if n.startswith(("fp8_scaled_mm promoting", "quantize delayed",
                                                                  "lowbit fp8 Linear"))])
    env = env_info()
    env["cpu"] = os.cpu_count()
    write_json(args.out, "host_overhead", {"env": env, "rows": rows, "errors": errors, "shape": f"{M}x{N}x{K}"})
    print(env)
    print_table(rows, ["call", "host_us"])
    if errors:
        print_table(errors, ["variant", "error"])


if __name__ == "__main__":
    main()
