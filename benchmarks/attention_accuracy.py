"""FP8 attention's error against the plain per-head E4M3 baseline, default recipe and Hadamard option.

    python3 benchmarks/attention_accuracy.py --out DIR [--seeds 0,1]

CPU (the exact emulation, ``backend="torch"``: the numbers the Triton kernels compute up to the
order of fp32 sums), times nothing. At three shapes (causal, GQA, S1024), with outlier inputs (N(0, 1),
0.1% of the values 20x; ``lowbit.validate.attention_baseline``): the relative L2 error against
float64 of O, dQ, dK and dV through ``lowbit.nn.functional.scaled_dot_product_attention`` and its
autograd, over the plain per-head E4M3 baseline's on the same inputs. The contract: the default
recipe at most 1.25 (``CONTRACT``); the aim for per-block scales with the Hadamard option: at
most 1 / 1.5. Rows: "error / plain E4M3 error" per shape, recipe, part and seed.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.common import append_results, env_info, parse_args, print_table, result_row  # noqa: E402

SHAPES = {  # (B, Hq, Hkv, S, D, causal)
    "S128-D64-causal": (2, 4, 4, 128, 64, True),
    "S77-D128-gqa": (2, 4, 2, 77, 128, False),
    "S1024-D128-causal": (1, 2, 2, 1024, 128, True),
}
PARTS = ("out", "dq", "dk", "dv")


def errors(shape, recipe, seed):
    """(lowbit's relative errors, the plain baseline's), each of O, dQ, dK, dV."""
    from lowbit.nn.functional import scaled_dot_product_attention
    from lowbit.validate.attention_baseline import exact, outlier_inputs, plain_e4m3, rel
    B, hq, hkv, S, D, causal = shape
    q, k, v, dout = outlier_inputs([(B, hq, S, D), (B, hkv, S, D), (B, hkv, S, D), (B, hq, S, D)], seed)
    ref = exact(q, k, v, dout, causal)
    base = [rel(a, r) for a, r in zip(plain_e4m3(q, k, v, dout, causal), ref)]
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    o = scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv, recipe=recipe, backend="torch")
    o.backward(dout)
    ours = [rel(a, r) for a, r in zip((o.detach(), q.grad, k.grad, v.grad), ref)]
    return ours, base


def main():
    def extra(p):
        p.add_argument("--seeds", default="0", help="comma list of input seeds")
    args = parse_args(__doc__, extra)
    from lowbit.scaling import AttentionRecipe
    env = env_info()
    rows, csv = [], []
    for name, shape in SHAPES.items():
        for label, recipe in (("default", AttentionRecipe()), ("hadamard", AttentionRecipe(hadamard=True))):
            for seed in (int(s) for s in args.seeds.split(",") if s):
                ours, base = errors(shape, recipe, seed)
                row = {"shape": name, "recipe": label, "seed": seed}
                for part, e, b in zip(PARTS, ours, base):
                    row[part] = e / b
                    csv.append(result_row(env, "attention accuracy (emulation)", name, f"lowbit {label} {part} seed {seed}",
                                          "error / plain E4M3 error", e / b, f"plain per-head E4M3 ({b:.3g})"))
                rows.append(row)
                print(row, flush=True)
    append_results(csv, args.out)
    print(env)
    print_table(rows, ["shape", "recipe", "seed", *PARTS])
    return 0


if __name__ == "__main__":
    sys.exit(main())
