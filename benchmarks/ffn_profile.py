"""Where the FFN training step's GPU time goes (H200): the kernels of ``benchmarks/ffn_train.py``'s
step under ``torch.profiler``, per variant and mode.

    python benchmarks/ffn_profile.py --out DIR [--variants lowbit-fp8@ws:eager,torchao-tensorwise:compiled]

For each ``variant:mode`` (variant names as ffn_train's: bf16, lowbit-<fmt>[@gemm_variant],
torchao-<recipe>): build it, run 5 warm-up steps, profile 5 steps, and report the step's GPU time
split into groups by kernel name (FP8/FP4 GEMMs, bf16 GEMMs, casts/quantize, elementwise and
inductor-fused kernels, reductions (amax), memset/copy, other), with each group's share, and the
top kernels by total device time, and the host's self CPU time by op. Writes DIR/ffn_profile.json;
a table per variant last. ``--cprofile variant:mode``: instead, cProfile of the Python side of 10
steps (DIR/ffn_host_profile.txt).
"""
from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from common import env_info, guarded, host_cprofile, parse_args, print_table, write_json  # noqa: E402
from ffn_train import SwiGLU, make_variant  # noqa: E402

GROUPS = [  # (group, regex on the kernel name), first match wins
    ("fp8/fp4 gemm", r"fp8_gemm|_gemm_ws|gemm_promote|scaled_mm_tma|scaled_mm_kernel|e4m3|fp4_gemm|f8f6f4|"
                     r"nvjet_sm90_q"),  # cuBLAS FP8 kernels: nvjet_sm90_q...
    ("bf16 gemm", r"gemm|xmma|cutlass|cublas|nvjet"),
    ("cast/quantize", r"quant|cast|amax|_to_fp8|float8|delayed_update|abs_max|reciprocal"),
    ("memset/copy", r"memset|memcpy|copy|fill"),
    ("fused/elementwise", r"triton_|elementwise|vectorized|silu|mul|add"),
    ("reduce", r"reduce"),
]


def group_of(name: str) -> str:
    low = name.lower()
    for g, pat in GROUPS:
        if re.search(pat, low):
            return g
    return "other"


def warm_step(name: str, mode: str):
    """The FFN training step of ``variant:mode`` (ffn_train's shapes), run 5 times (compiled,
    autotuned); returns the step function."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    base = SwiGLU(4096, 14336).to("cuda", torch.bfloat16)
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    m = make_variant(base, name)
    fn = {"compiled": lambda: torch.compile(m),
          "compiled-graph": lambda: torch.compile(m, mode="reduce-overhead")}.get(mode, lambda: m)()
    params = list(m.parameters())

    def step():  # as ffn_train's: grads set to None (zero_grad), no accumulation kernels
        if mode == "compiled-graph":
            torch.compiler.cudagraph_mark_step_begin()
        x.grad = None
        for p in params:
            p.grad = None
        fn(x).backward(gy)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    return step


def profile(name: str, mode: str, steps: int = 5) -> dict:
    step = warm_step(name, mode)
    import time
    t0 = time.perf_counter()
    for _ in range(30):
        step()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) / 30 * 1e3
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name, [0.0, 0])
            k[0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            k[1] += 1
    total_us = sum(v[0] for v in kernels.values()) / steps
    groups = {}
    for kname, (us, n) in kernels.items():
        g = groups.setdefault(group_of(kname), [0.0, 0])
        g[0] += us / steps
        g[1] += n / steps
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:25]
    cpu = sorted((e for e in prof.key_averages() if e.self_cpu_time_total > 0),
                 key=lambda e: -e.self_cpu_time_total)[:12]
    cpu_ms = sum(e.self_cpu_time_total for e in prof.key_averages()) / steps / 1e3
    return {"variant": name, "mode": mode, "gpu_ms_per_step": total_us / 1e3, "wall_ms_per_step": wall_ms,
            "groups": {g: {"ms": us / 1e3, "launches": n, "share": us / total_us} for g, (us, n) in groups.items()},
            "top": [{"kernel": k[:110], "ms_per_step": us / steps / 1e3, "calls_per_step": n / steps}
                    for k, (us, n) in top],
            "host_ms_per_step": cpu_ms,
            "host_top": [{"op": e.key[:110], "self_cpu_ms_per_step": e.self_cpu_time_total / steps / 1e3,
                          "calls_per_step": e.count / steps} for e in cpu]}


def host_profile(name: str, mode: str, steps: int = 10, top: int = 35) -> str:
    """cProfile of ``steps`` training steps (after warm-up): the Python functions by own time and
    by cumulative time (the host side of the step: where a host-bound step spends it)."""
    return host_cprofile(warm_step(name, mode), steps, top)


def main():
    def extra(p):
        p.add_argument("--variants", default="bf16:eager,lowbit-fp8:eager,lowbit-fp8:compiled,"
                                             "torchao-tensorwise:compiled")
        p.add_argument("--cprofile", default=None, help="variant:mode whose host side to cProfile (10 steps)")
    args = parse_args(__doc__.splitlines()[0], extra)
    if args.cprofile:
        name, _, mode = args.cprofile.partition(":")
        text = host_profile(name, mode or "eager")
        print(text)
        with open(os.path.join(args.out, "ffn_host_profile.txt"), "w") as f:
            f.write(text)
        return
    results, errors = [], []
    for spec in args.variants.split(","):
        name, _, mode = spec.partition(":")
        r = guarded(errors, spec, lambda: profile(name, mode or "eager"))
        if r:
            results.append(r)
            print(f"{spec}: wall {r['wall_ms_per_step']:.3f} ms/step, GPU {r['gpu_ms_per_step']:.3f}; " + ", ".join(
                f"{g} {v['ms']:.2f} ms ({v['launches']:.0f})" for g, v in sorted(r["groups"].items())), flush=True)
        torch.cuda.empty_cache()
    write_json(args.out, "ffn_profile", {"env": env_info(), "results": results, "errors": errors})
    for r in results:
        print(f"\n{r['variant']} ({r['mode']}): {r['gpu_ms_per_step']:.3f} ms of GPU time a step, "
              f"{r['wall_ms_per_step']:.3f} ms wall")
        print_table(r["top"], ["kernel", "ms_per_step", "calls_per_step"])
        print(f"host (self CPU time under the profiler): {r['host_ms_per_step']:.3f} ms a step")
        print_table(r["host_top"], ["op", "self_cpu_ms_per_step", "calls_per_step"])
    if errors:
        print_table(errors, ["variant", "error"])


if __name__ == "__main__":
    main()
