"""Llama-3-8B FFN training step (8192 tokens, 4096 -> 14336 -> 4096 SwiGLU), forward + backward.

bf16 vs lowbit recipes vs torchao float8 (tensorwise, rowwise) when installed, eager and
torch.compile'd; speedups are against bf16 in the same mode and the same run. Before timing, each
variant's output and input gradient are compared with the bf16 step (relative Frobenius error).

    python benchmarks/ffn_train.py --out DIR [--quick] [--formats fp8,fp8+precise,fp8-block] [--modes eager]

Modes: ``eager``; ``compiled`` (``torch.compile``, default mode); ``graph`` (the eager step
captured whole in one CUDA graph after three warm-up steps, then replayed: no host cost at all);
``compiled-graph`` (``torch.compile(mode="reduce-overhead")``: inductor's CUDA graphs; the row
records how many graphs inductor declined to capture, ``cudagraph_skips``, with the reasons in
the log).

``fmt+precise``: the recipe with ``fast_accum_fwd=False`` (FP32 promotion in the forward GEMM too).
``fmt@tma``: the FP8 GEMMs on the plain-Triton TMA kernel only (backend ``triton-tma``, built
with a backend whose ``GemmFP8Tuning.kernel`` is "tma"), not the promoting Gluon kernel: the A/B of it.
"""
from __future__ import annotations

import copy
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from common import append_results, bench_ms, env_info, guarded, parse_args, print_table, result_row, write_json  # noqa: E402


class SwiGLU(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.w1 = nn.Linear(d, h, bias=False)
        self.w3 = nn.Linear(d, h, bias=False)
        self.w2 = nn.Linear(h, d, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def make_variant(base: nn.Module, name: str) -> nn.Module:
    m = copy.deepcopy(base)
    if name == "bf16":
        return m
    if name.startswith("torchao-"):
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        cfg = Float8LinearConfig.from_recipe_name(name.split("-", 1)[1])
        return convert_to_float8_training(m, config=cfg)
    import dataclasses
    import lowbit
    spec, _, gemm_variant = name.split("lowbit-", 1)[1].partition("@")
    fmt, _, mode = spec.partition("+")
    backend = "auto"
    if gemm_variant:  # a GEMM kernel forced: "tma", "pointer" or "ws" (GemmFP8Tuning.kernel)
        from lowbit.kernels import BACKENDS
        from lowbit.kernels.triton import make_backend
        from lowbit.kernels.triton.gemm_fp8 import GEMM_FP8_TUNING
        backend = f"triton-{gemm_variant}"
        BACKENDS.register(make_backend(backend, priority=0,
                                       gemm_fp8_tuning=GEMM_FP8_TUNING.override(kernel=gemm_variant)))
    recipe = None
    if mode == "precise":  # promote in the forward GEMM too (default: fast forward accumulation)
        from lowbit.convert import recipe_for
        recipe = dataclasses.replace(recipe_for(fmt), fast_accum_fwd=False)
    return lowbit.convert(m, fmt, recipe=recipe, filter=lambda n, mod: True, backend=backend)


def capture(step):
    """The replay of one CUDA graph of ``step`` (after three warm-up calls on a side stream, so the
    autotuners and the allocator have settled before capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):  # the stream whose library handles the warm-up made
        step()
    return graph.replay


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    def extra(p):
        p.add_argument("--formats", default="fp8,fp8@tma,fp8+precise,fp8-current,fp8-block,fp8-block@tma,"
                                            "fp8-rowwise")
        p.add_argument("--modes", default="eager,compiled")
        p.add_argument("--torchao", default="tensorwise,rowwise", help="torchao recipes to measure (if installed)")
    args = parse_args(__doc__, extra)
    if "compiled-graph" in args.modes:
        torch._logging.set_logs(perf_hints=True)  # inductor says why it skips a CUDA graph
    torch.manual_seed(0)
    tokens, d, h = (2048, 1024, 3584) if args.quick else (8192, 4096, 14336)
    dev = "cuda"
    base = SwiGLU(d, h).to(dev, torch.bfloat16)
    x0 = torch.randn(tokens, d, device=dev, dtype=torch.bfloat16)
    gy = torch.randn(tokens, d, device=dev, dtype=torch.bfloat16)
    flops = 3 * 3 * 2 * tokens * d * h  # 3 GEMMs forward, twice that backward

    names = ["bf16"] + [f"lowbit-{f}" for f in args.formats.split(",") if f]
    try:
        import torchao  # noqa: F401
        names += [f"torchao-{r}" for r in args.torchao.split(",") if r]
    except ImportError:
        print("torchao not installed: its variants are not measured")

    ref = {}
    rows = []
    for mode in args.modes.split(","):
        for name in names:
            row = {"variant": name, "mode": mode}

            def run(name=name, mode=mode, row=row):
                from torch._dynamo.utils import counters
                torch._dynamo.reset()  # each variant compiles afresh (no cache-size limit across variants)
                m = make_variant(base, name)
                fn = {"compiled": lambda: torch.compile(m),
                      "compiled-graph": lambda: torch.compile(m, mode="reduce-overhead")}.get(mode, lambda: m)()
                x = x0.clone().requires_grad_(True)
                skips0 = counters["inductor"]["cudagraph_skips"]
                breaks0 = sum(counters["graph_break"].values())

                params = list(m.parameters())

                def step():  # grads set to None, as zero_grad() does: no accumulation kernels
                    if mode == "compiled-graph":
                        torch.compiler.cudagraph_mark_step_begin()
                    x.grad = None
                    for p in params:
                        p.grad = None
                    y = fn(x)
                    y.backward(gy)
                    return y
                t0 = time.time()
                y = step()
                torch.cuda.synchronize()
                row["first_step_s"] = round(time.time() - t0, 1)
                if mode.startswith("compiled"):
                    row["graph_breaks"] = sum(counters["graph_break"].values()) - breaks0
                if name == "bf16" and mode == "eager":
                    ref["y"], ref["gx"] = y.detach().clone(), x.grad.detach().clone()
                if ref:
                    row["rel_err_y"] = rel(y.detach(), ref["y"])
                    row["rel_err_dx"] = rel(x.grad, ref["gx"])
                timed = step
                if mode == "graph":
                    timed = capture(step)
                if mode == "compiled-graph":
                    for _ in range(3):  # inductor records its graphs in the first calls
                        step()
                    row["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"] - skips0
                ms = bench_ms(timed, warmup=100, rep=300)  # ms: ~10 warm-up steps, ~30 timed
                if ref and mode != "eager":  # what the replays / compiled steps left in x.grad
                    torch.cuda.synchronize()
                    row["rel_err_dx_last"] = rel(x.grad, ref["gx"])
                row["ms"] = ms
                row["tflops"] = flops / ms * 1e-9
                rows.append(row)
                print(f"{name} ({mode}): {ms:.3f} ms, err y {row.get('rel_err_y')}, dx {row.get('rel_err_dx')}, "
                      f"first step {row['first_step_s']} s", flush=True)  # a time limit loses no row
            guarded(rows, f"{name} ({mode})", run)
            torch.cuda.empty_cache()
        bf = next((r["ms"] for r in rows if r.get("mode") == mode and r.get("variant") == "bf16" and "ms" in r), None)
        for r in rows:
            if r.get("mode") == mode and bf and "ms" in r:
                r["speedup_vs_bf16"] = bf / r["ms"]

    env = env_info()
    env["shape"] = f"tokens={tokens} d={d} hidden={h} SwiGLU fwd+bwd"
    write_json(args.out, "ffn_train", {"env": env, "rows": rows})
    append_results([result_row(env, "ffn_train", env["shape"], f"{r['variant']} {r['mode']}", "ms", r["ms"],
                               f"bf16 {r['mode']}", r.get("speedup_vs_bf16")) for r in rows if "ms" in r], args.out)
    print(env)
    print_table(rows, ["variant", "mode", "ms", "tflops", "speedup_vs_bf16", "rel_err_y", "rel_err_dx",
                       "rel_err_dx_last", "first_step_s", "graph_breaks", "cudagraph_skips", "error"])


if __name__ == "__main__":
    main()
