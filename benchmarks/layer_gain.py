"""Where one Linear gains from each format on this GPU: the figures behind ``lowbit.sizing``.

    python benchmarks/layer_gain.py --out DIR [--quick] [--formats fp8,fp8-block,mxfp8]
                                    [--dims 768,2048,4096,8192] [--tokens 8192] [--min-gain 0.1]

For every (M, K, N) of the grid (M = ``--tokens``, K = in_features and N = out_features from
``--dims``): the training step of one bias-free Linear, forward and backward (the three GEMMs
``y = x W^T``, ``dx = dy W``, ``dW = dy^T x``), bf16 ``nn.Linear`` against the same layer after
``lowbit.convert`` (its casts, their transposes and the three low-precision GEMMs), each timed
as a CUDA graph of the step over three rotating input copies (``common.graph_ms``: device time,
no host time, no input found in L2). The gain is ``1 - t_fmt / t_bf16``.

Correctness first: at one small shape each format's output and input gradient are compared with
bf16 (relative Frobenius error below ``TOL`` of its family); a format that fails is not timed.

Last, for each format's family (``lowbit.sizing.family``) at the rule's token count, the corners
``lowbit.sizing.corners_from_gains`` derives from the measured gains at ``--min-gain``, beside
the shipped ``HOPPER`` corners: paste them into ``lowbit/sizing.py``. Rows for results.csv:
``fwd_bwd_ms`` per variant (anchor bf16, ratio = speedup) and DIR/layer_gain.json.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.common import (append_results, env_info, graph_ms, guarded, parse_args, print_table,  # noqa: E402
                               result_row, write_json)

TOL = {"fp8": 0.1, "fp4": 0.3}  # relative error of y and dx against bf16 (FP8 E4M3/E5M2, FP4 E2M1)
COPIES = 3


def layer(k: int, n: int, fmt: str) -> nn.Module:
    import lowbit
    torch.manual_seed(0)
    lin = nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    return lin if fmt == "bf16" else lowbit.convert(nn.Sequential(lin), fmt, filter=lambda name, m: True)


def step_fns(mod: nn.Module, m: int, k: int, n: int):
    """One callable per input copy: zero the grads, forward, backward with a fixed output grad."""
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(COPIES)]
    gy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    params = list(mod.parameters())

    def make(x):
        def fn():
            x.grad = None
            for p in params:
                p.grad = None
            mod(x).backward(gy)
        return fn
    return [make(x) for x in xs]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def check(fmt: str) -> dict:
    """Output and input gradient of the converted layer against bf16 at 256 x 512 -> 512."""
    from lowbit.convert import recipe_for
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    gy = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    out = {}
    for name in ("bf16", fmt):
        xi = x.clone().requires_grad_(True)
        y = layer(512, 512, name)(xi)
        y.backward(gy)
        out[name] = (y.detach(), xi.grad)
    err = max(rel(a, b) for a, b in zip(out[fmt], out["bf16"]))
    tol = TOL[recipe_for(fmt).kind]
    if not err < tol:
        raise AssertionError(f"{fmt}: relative error {err:.3g} against bf16 exceeds {tol}")
    return {"rel_err": err}


def main():
    from lowbit import sizing
    from lowbit.convert import FORMATS, recipe_for

    def extra(p):
        p.add_argument("--formats", default=None, help="lowbit formats (default: the FP8 ones; --quick: "
                                                       "fp8, fp8-block, mxfp8)")
        p.add_argument("--dims", default=None, help="K and N grid (default 768..14336; --quick 768,2048,4096,8192)")
        p.add_argument("--tokens", default=str(sizing.HOPPER.tokens), help="comma list of M")
        p.add_argument("--min-gain", type=float, default=sizing.HOPPER.min_gain)
    args = parse_args(__doc__.splitlines()[0], extra)
    fmts = (args.formats or ("fp8,fp8-block,mxfp8" if args.quick else
                             "fp8,fp8-current,fp8-rowwise,fp8-block,mxfp8")).split(",")
    unknown = [f for f in fmts if f not in FORMATS]
    if unknown:
        raise SystemExit(f"unknown formats {unknown}; choose from {list(FORMATS)}")
    dims = [int(d) for d in (args.dims or ("768,2048,4096,8192" if args.quick else
                                           "768,1024,1536,2048,3072,4096,8192,14336")).split(",")]
    tokens = [int(t) for t in args.tokens.split(",")]
    env = env_info()
    table, rows = [], []
    checked = {f: guarded(table, f"{f} check", lambda f=f: check(f)) for f in fmts}
    fmts = [f for f in fmts if checked[f] is not None]
    gains = {(f, m): {} for f in fmts for m in tokens}
    for m in tokens:
        for k in dims:
            for n in dims:
                shape = f"M={m} K={k} N={n}"
                row = {"shape": shape}
                bf = guarded(table, f"bf16 {shape}", lambda: graph_ms(step_fns(layer(k, n, "bf16"), m, k, n)))
                if bf is None:
                    continue
                row["bf16_ms"] = bf
                rows.append(result_row(env, "linear fwd+bwd", shape, "bf16", "fwd_bwd_ms", bf))
                for f in fmts:
                    ms = guarded(table, f"{f} {shape}", lambda f=f: graph_ms(step_fns(layer(k, n, f), m, k, n)))
                    if ms is not None:
                        gains[(f, m)][(k, n)] = 1 - ms / bf
                        row[f] = bf / ms
                        rows.append(result_row(env, "linear fwd+bwd", shape, f"lowbit {f}", "fwd_bwd_ms", ms,
                                               anchor="bf16", ratio=bf / ms))
                    torch.cuda.empty_cache()
                table.append(row)
                print(row, flush=True)  # a time limit loses no row
    derived = []
    for f in fmts:
        fam = sizing.family(recipe_for(f))
        for m in tokens:
            corners = sizing.corners_from_gains(dims, dims, gains[(f, m)], args.min_gain)
            derived.append({"format": f, "family": fam, "tokens": m, "derived corners": corners,
                            "HOPPER corners": getattr(sizing.HOPPER.sizes(fam), "corners", None)})
    append_results(rows, args.out)
    write_json(args.out, "layer_gain", {"env": env, "checks": checked, "table": table, "derived": derived,
                                        "min_gain": args.min_gain, "rows": rows})
    print(env)
    print("speedup of the Linear's fwd+bwd over bf16 (bf16_ms: its time)")
    print_table(table, ["shape", "bf16_ms", *fmts, "variant", "error"])
    print(f"corners (min K, min N) where the gain is >= {args.min_gain:.0%} (lowbit.sizing.LayerSizes):")
    print_table(derived, ["format", "family", "tokens", "derived corners", "HOPPER corners"])


if __name__ == "__main__":
    main()
