"""GPU check of the compiled tensorwise graph's x^T recast (``lowbit.nn.ops.cast_t_fusible``).

    python3 benchmarks/recast_gpu.py --out DIR

1. The cast itself: ``cast_t_fusible(x, scale, fmt)``, eager and compiled by inductor (whose
   Triton ``/`` for float32 is approximate: the cast divides in float64), against the Triton
   kernel's x^T (``quantize_fp8_t(..., backend="triton")``), E4M3 and E5M2, bf16 and fp32 inputs,
   regular and special values (NaN, +-inf, -0, subnormals, saturating): differing codes, NaN
   compared as NaN (its sign is no part of the contract).
2. The layer: a converted ``Linear -> GELU -> Linear`` on the Triton kernels over three steps,
   eager and ``torch.compile`` (inductor), "fp8" (delayed) and "fp8-current": the largest
   difference in output and gradients, relative to their amax (zero when inductor's recompute of
   Linear 2's input keeps the bf16 rounding the eager forward makes).

Prints one table; exits 1 if a cast differs.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bitexact import sample  # noqa: E402
from benchmarks.common import parse_args, print_table  # noqa: E402


def cast_rows() -> list:
    from lowbit.kernels.api import quantize_fp8_t
    from lowbit.nn.ops import cast_t_fusible
    from lowbit.scaling import Current

    recipe, rows = Current(), []
    compiled = torch.compile(cast_t_fusible, fullgraph=True, dynamic=False)
    for role in ("input", "grad"):
        fmt = recipe.format(role)
        for dtype in (torch.bfloat16, torch.float32):
            for special in (False, True):
                x = sample(1000, 4096, 7, dtype, "cuda", special)
                q, q_t = quantize_fp8_t(x, recipe, role, None, "triton")
                want, nan = q_t._data.view(torch.uint8), q_t._data.float().isnan()
                for how, f in (("eager", cast_t_fusible), ("inductor", compiled)):
                    got = f(x, q._scale, fmt)
                    bad = (got.float().isnan() != nan).sum() + (got.view(torch.uint8) != want)[~nan].sum()
                    rows.append({"case": f"cast {fmt.name} {str(dtype)[6:]} {'special' if special else 'randn'}",
                                 "how": how, "differing": int(bad)})
    return rows


def layer_rows() -> list:
    from torch import nn

    import lowbit
    from lowbit.convert import FORMATS

    rows = []
    for fmt in ("fp8", "fp8-current"):
        runs = []
        for compiled in (False, True):
            torch._dynamo.reset()
            torch.manual_seed(0)
            m = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda().bfloat16()
            m = lowbit.convert(m, recipe=FORMATS[fmt](), filter=lambda n, mod: True, backend="triton")
            f = torch.compile(m, fullgraph=True) if compiled else m
            g, out = torch.Generator().manual_seed(1), []
            for _ in range(3):
                x = torch.randn(2048, 1024, generator=g).cuda().bfloat16().requires_grad_()
                y = f(x)
                y.float().square().mean().backward()
                out += [y.detach(), x.grad, m[0].weight.grad, m[2].weight.grad]
                m.zero_grad()
            runs.append(out)
        rel = max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item() for a, b in zip(*runs))
        equal = sum(torch.equal(a, b) for a, b in zip(*runs))
        rows.append({"case": f"layer {fmt} 2048x1024x4096 3 steps", "how": "inductor vs eager",
                     "differing": f"{len(runs[0]) - equal}/{len(runs[0])} tensors", "max_rel": rel})
    return rows


def main():
    parse_args(__doc__.splitlines()[0])
    rows = cast_rows()
    rows += layer_rows()
    print_table(rows, ["case", "how", "differing", "max_rel"])
    sys.exit(1 if any(r["differing"] != 0 for r in rows if r["case"].startswith("cast")) else 0)


if __name__ == "__main__":
    main()
