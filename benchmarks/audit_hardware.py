"""The GPU's tensor-core accumulator, measured (``lowbit audit hardware``), as benchmark records.

    python3 benchmarks/audit_hardware.py --out DIR [--quick] [--kernels]

Runs ``lowbit.validate.audit_hardware()``: bits an FP8 E4M3 and a bf16 dot keep when a product is
aligned to a larger one (in one MMA step and across steps; cuBLAS ``torch._scaled_mm`` with fast
accumulation, lowbit's fast-accumulation GEMM, cuBLAS bf16 ``torch.mm``), and the FP32 promotion
interval of lowbit's and cuBLAS's FP8 GEMMs (``--quick``: K = 1024, else 4096). One results.csv
row per probe (workload "audit hardware", metric "accumulator bits" or "promotion interval (K)";
a probe that never promotes within K records K, one that failed records nothing and prints why).
``--kernels``: also the GPU-native ``lowbit audit kernels`` (quick with ``--quick``), one row per
kernel and backend (metric "max bound ratio" or "max ULP"; "failed checks"), and DIR/audit_kernels.json.
Prints the tables last; DIR/audit_hardware.json.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.common import append_results, env_info, parse_args, result_row, write_json  # noqa: E402


def hardware_rows(env, res) -> list:
    rows = []
    for p in res.results:
        if p.detail.startswith("error"):
            continue
        if p.probe == "bits":
            rows.append(result_row(env, "audit hardware", f"K={p.K}", f"{p.kernel}: {p.detail.split(';')[0]}",
                                   "accumulator bits", p.value))
        elif "cannot be seen" not in p.detail:
            rows.append(result_row(env, "audit hardware", f"K={p.K}", p.kernel, "promotion interval (K)",
                                   p.value if p.value is not None else p.K))
    return rows


def kernel_rows(env, res) -> list:
    rows, groups = [], {}
    for r in res.results:
        groups.setdefault((r.kernel, r.backend, r.metric), []).append(r)
    for (kernel, backend, metric), rs in groups.items():
        shape = f"{len(rs)} checks ({'quick' if res.config.quick else 'full'})"
        rows.append(result_row(env, "audit kernels", shape, f"{kernel} [{backend}]",
                               "max bound ratio" if metric == "bound ratio" else metric, max(r.value for r in rs)))
        rows.append(result_row(env, "audit kernels", shape, f"{kernel} [{backend}]", "failed checks",
                               sum(not r.passed for r in rs)))
    return rows


def main():
    def extra(p):
        p.add_argument("--kernels", action="store_true", help="also run the GPU-native lowbit audit kernels")
    args = parse_args(__doc__.splitlines()[0], extra)
    env = env_info()
    if not torch.cuda.is_available():
        print("benchmarks/audit_hardware.py needs a CUDA GPU; none found (nothing was measured).")
        write_json(args.out, "audit_hardware", {"env": env, "error": "no CUDA GPU"})
        return
    from lowbit.validate import audit_hardware, audit_kernels
    t0 = time.time()
    hw = audit_hardware(K_promotion=1024 if args.quick else 4096)
    rows = hardware_rows(env, hw)
    payload = {"env": env, "hardware": hw.to_dict(), "hardware_s": time.time() - t0}
    kern = None
    if args.kernels:
        t1 = time.time()
        kern = audit_kernels(quick=args.quick)
        write_json(args.out, "audit_kernels", kern.to_dict())
        rows += kernel_rows(env, kern)
        payload["kernels_s"] = time.time() - t1
        payload["kernels_passed"] = kern.passed
    append_results(rows, args.out)
    write_json(args.out, "audit_hardware", payload)
    if kern is not None:
        print("\n".join(line for line in kern.format().splitlines() if "FAIL" in line or "checks on" in line))
        print(f"audit kernels: {payload['kernels_s']:.0f} s")
    print(f"audit hardware: {payload['hardware_s']:.0f} s\n")
    print(hw.format())


if __name__ == "__main__":
    main()
