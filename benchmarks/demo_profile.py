"""Where the demo GPT's training step spends its time on one GPU (50M model, 16 x 256 tokens).

    python benchmarks/demo_profile.py --out DIR [--formats bf16,fp8,...]

For each format: eager ms/step and CUDA-graph ms/step (``lowbit.demo.step.TrainStep``; NVFP4's
stochastic rounding is not capturable: eager only), the largest loss difference between the eager
and the graphed run over 25 steps from the same weights and batches, the number of Triton autotune benchmark calls
after warm-up (must be 0: a re-tune per step would dominate), and a cProfile of the eager step's
host time for the ``--cprofile`` formats. About 1-2 minutes on an H200. Writes
DIR/demo_profile.json; prints the table last.
"""
from __future__ import annotations

import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from common import append_results, env_info, guarded, parse_args, print_table, result_row, write_json  # noqa: E402


def _extra(p):
    p.add_argument("--formats", default="bf16,fp8,fp8-current,fp8-block,mxfp8,nvfp4")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--cprofile", default="fp8,nvfp4", help="formats whose eager step is cProfiled")


class _TuneCounter:
    """Counts Autotuner benchmark calls (the method is ``_bench`` in triton 3.x)."""

    def __init__(self):
        from triton.runtime import autotuner
        self.cls, self.n = autotuner.Autotuner, 0
        self.orig = getattr(self.cls, "_bench", None)
        if self.orig is not None:
            counter = self

            def bench(this, *a, **k):
                counter.n += 1
                return counter.orig(this, *a, **k)
            self.cls._bench = bench


def _model(fmt, dev):
    import lowbit
    from lowbit.demo.model import GPT, SIZES
    torch.manual_seed(0)
    m = GPT(SIZES["50m"]).to(dev)
    if fmt != "bf16":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lowbit.convert(m, fmt)
    return m


def _time_steps(step, x, y, n, losses):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        losses.append(step(x, y))
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


def one(fmt, args, rows, tune):
    from lowbit.demo.step import TrainStep, make_optimizer
    dev = torch.device("cuda")
    x = torch.randint(0, 256, (args.batch, 256), device=dev)
    row = {"variant": fmt}
    curves = {}
    from lowbit.demo.train import _capturable
    for graph in (False, True) if _capturable(fmt) else (False,):
        m = _model(fmt, dev)
        opt = make_optimizer(m, 1e-4, dev)
        step = TrainStep(m, opt, amp=True, device=dev, graph=graph)
        key = "graph" if graph else "eager"
        losses = curves[key] = [step(x, x) for _ in range(5)]  # warm-up (and capture)
        n0 = tune.n
        ms = _time_steps(step, x, x, 20, losses)
        row[f"{key}_ms"] = ms
        row[f"{key}_tok_s"] = args.batch * 256 / ms * 1e3
        row[f"{key}_retunes"] = tune.n - n0
        if graph:
            row["captured"] = step.graph is not None
            row["graph_error"] = step.graph_error
        elif fmt in args.cprofile.split(","):  # where the eager step's host time goes
            import cProfile
            import pstats
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(3):
                step(x, x)
            torch.cuda.synchronize()
            prof.disable()
            print(f"--- {fmt}: eager step, host time by function (3 steps) ---")
            pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        del m, opt, step
        torch.cuda.empty_cache()
    if len(curves) == 2:  # same seed, same batches: the graph replays the eager math
        e, g = (torch.stack(curves[k]).float() for k in ("eager", "graph"))
        row["graph_vs_eager_max_loss_diff"] = (e - g).abs().max().item()
    rows.append(row)
    print(row, flush=True)


def main():
    args = parse_args(__doc__, _extra)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    tune = _TuneCounter()
    rows = []
    for fmt in [f.strip() for f in args.formats.split(",") if f.strip()]:
        guarded(rows, fmt, lambda: one(fmt, args, rows, tune))
        write_json(args.out, "demo_profile", {"env": env_info(), "rows": rows})
    env = env_info()
    append_results([result_row(env, "demo GPT step", "50M 16x256 tokens", f"{r['variant']} {mode}", "ms", r[f"{mode}_ms"])
                    for r in rows for mode in ("eager", "graph") if r.get(f"{mode}_ms")], args.out)
    print_table(rows, ["variant", "eager_ms", "eager_tok_s", "eager_retunes", "graph_ms", "graph_tok_s",
                       "graph_retunes", "captured", "graph_vs_eager_max_loss_diff", "graph_error", "error"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
