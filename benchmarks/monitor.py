"""What ``lowbit.monitor`` costs, and that it finds what it should, on one GPU.

    python benchmarks/monitor.py --out DIR [--quick] [--layers 8] [--compile whole|regional]
                                 [--dtypes bf16,fp8,fp8-block] [--modes compiled,eager] [--rounds 5]

Checks first (a 2-layer Llama of hidden 256, bf16, on the GPU):
* a NaN planted in one weight, and one made in another module's backward, are named exactly
  (module, phase, step), eager, compiled (inductor) and compiled with CUDA graphs
  (``mode="reduce-overhead"``: the records write the static buffer in place, so the replays record);
* no host sync inside a monitored forward + backward (``torch.cuda.set_sync_debug_mode("warn")``,
  warnings counted, eager);
* the Triton reductions give the torch ops' figures (all columns but the clock; SQNR's float64
  sums to 1e-9), and their read bandwidth on 512 MiB of bf16, without a scale, with a cast's scale,
  with SQNR and with 1x128 block scales (beside the torch ops of the block case), against torch's
  one-read ``torch.amax(x)``; the host microseconds of one launch with the monitor's kept plans
  and through the JIT.

Then the cost: the training step (forward with labels, backward, grads set to None; no optimizer, so
the ratio is against the smallest step) of a Hugging Face Llama with ``--layers`` decoder layers of
Llama-3-8B shape (hidden 4096, intermediate 14336, 32 heads, 8 KV heads, vocab 128256), 2 x 4096
tokens, bf16 and lowbit formats (``--dtypes``: "bf16" or ``lowbit.convert`` names), compiled
(``--compile whole``: ``torch.compile(model)``; ``regional``: each decoder layer compiled in place,
one compile shared by all): no monitor, ``lowbit.monitor(every=1)`` (``mon.step()`` inside the timed
step), ``sqnr_every=10``, and ``torch.autograd.detect_anomaly`` (no monitor); with ``--modes
compiled,eager`` also eager: no monitor, every=1, detect_anomaly. Targets: every=1 <= 1.03x, SQNR
every 10 <= 1.05x of no monitor, compiled. The compiled steps without a monitor and with every=1 are
also profiled (device ms per step, the stats kernels' share, launches, Dynamo graphs and graph
breaks, the host ms to issue a step from an idle device; ``--host-profile``: the monitored step's
cProfile), and the kernels the monitor adds are printed, largest first. Attaching and detaching a
monitor resets Dynamo, so every compiled variant compiles anew (and under regional compilation each
watched layer compiles on its own: its rows are constants of its graph). Each figure: median over
rounds of (10 steps timed with CUDA events) / 10, after 3 warm-up steps (the first step's seconds
are recorded too). ``--quick``: 2 layers, regional compile, 2 rounds (within 4 minutes on an H200).
The full run is one command per dtype (about 6-8 minutes each, mostly compiling): ``--dtypes bf16``,
then ``--dtypes fp8``.
"""
from __future__ import annotations

import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from common import (append_results, bench_ms, env_info, guarded, host_cprofile, kernel_profile,  # noqa: E402
                    parse_args, print_table, result_row, write_json)


def llama(layers, hidden, inter, heads, kv, vocab, seed=0):
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                   num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                                   max_position_embeddings=4096, use_cache=False, attn_implementation="sdpa")
    torch.manual_seed(seed)
    dflt = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            return transformers.LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(dflt)


def converted(model, fmt: str):
    import lowbit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the output head stays in bf16
        return lowbit.convert(model, fmt)


def make_step(model, fn, ids, mon=None, graphs=False):
    params = [p for p in model.parameters() if p.requires_grad]

    def step():
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        for p in params:
            p.grad = None
        out = fn(input_ids=ids, labels=ids)
        out.loss.backward()
        if mon is not None:
            mon.step()
    return step


def _issue_ms(step, calls: int = 5) -> float:
    """Host ms to issue one step with the device idle at its start (the median of ``calls``): above
    the step's device time, the host is what the GPU waits for."""
    per = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        per.append((time.perf_counter() - t0) * 1e3)
    return sorted(per)[len(per) // 2]


def timed_ms(step, rounds, steps=10, warmup=3) -> float:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    per = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(steps):
            step()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) / steps)
    return sorted(per)[len(per) // 2]


# ---- checks ----------------------------------------------------------------------------------
def _planted(mode: str, out_dir: str) -> dict:
    """A NaN in a weight at step 2 (repaired at step 3) and a NaN made in an act_fn's backward at
    step 4: the culprit of each step, from the JSON lines."""
    import json
    import lowbit
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "monitor"))
    from planted import PlantedSiLU
    torch._dynamo.reset()
    model = llama(2, 256, 512, 4, 2, 1024)
    act = PlantedSiLU().cuda()
    model.model.layers[1].mlp.act_fn = act
    w = model.model.layers[0].self_attn.v_proj.weight
    log = os.path.join(out_dir, f"monitor_check_{mode}.jsonl")
    mon = lowbit.monitor(model, on_anomaly="record", log=log)
    fn = model if mode == "eager" else torch.compile(model, mode="reduce-overhead" if mode == "graphs" else None)
    ids = torch.randint(0, 1024, (2, 128), device="cuda")
    step = make_step(model, fn, ids, mon, graphs=mode == "graphs")
    syncs = None
    for s in range(6):
        with torch.no_grad():
            if s == 2:
                w[3, 5] = float("nan")
            if s == 3:
                w.nan_to_num_(0.0)
        act.gain.fill_(float("nan") if s == 4 else 1.0)
        if mode == "eager" and s == 1:  # every host sync inside forward + backward warns
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    fn(input_ids=ids, labels=ids).loss.backward()
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            syncs = sum("synchroniz" in str(c.message) for c in caught)
            for p in model.parameters():
                p.grad = None
            mon.step()
            continue
        step()
    mon.detach()
    with open(log) as fh:
        got = [(x["culprit"] or {}) for x in map(json.loads, fh)]
    got = [(c.get("module"), c.get("phase"), c.get("tensor")) if c else None for c in got]
    want = [None, None, ("model.layers.0.self_attn.v_proj", "forward", "weight"), None,
            ("model.layers.1.mlp.act_fn", "backward", "grad_input"), None]
    return {"variant": f"check planted NaN ({mode})", "ok": got == want, "culprits": got,
            "first_nonfinite": str(mon.first_nonfinite), "host_syncs": syncs}


def _host_us(fn, calls: int = 2000) -> float:
    """Host microseconds a call of ``fn`` (a launch on a tiny tensor: the device keeps up)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def _kernel_check() -> dict:
    from lowbit.dtypes.formats import get_format
    from lowbit.monitor.stats import COL, block_scale, reduce_into, reset_template
    from lowbit.monitor.stats_kernel import launch, launch_blocks
    from lowbit.scaling import Blockwise
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16) * 30
    x[5, 7], x[9, 1] = float("nan"), float("inf")
    scale = torch.tensor(0.05, device="cuda")
    f = get_format("e4m3")
    cols = [c for n, c in COL.items() if n not in ("seq", "signal", "noise")]
    sums = [COL["signal"], COL["noise"]]
    sb, blk, fb = block_scale(x, Blockwise(), "input", None, False)  # 1x128 scales
    same, sqnr_rel = True, 0.0
    for sq in (False, True):
        a, b = reset_template(2, "cuda"), reset_template(2, "cuda")
        reduce_into(a, 0, x, scale, f, sqnr=sq, kernel=False)
        launch(b, 0, x, scale, f, sqnr=sq)
        reduce_into(a, 1, x, sb, fb, sqnr=sq, kernel=False, block=blk)
        launch_blocks(b, 1, x, sb, blk, fb, sqnr=sq)
        same &= bool(torch.equal(a[:2, cols], b[:2, cols]))
        if sq:
            sqnr_rel = float(((b[:2, sums] - a[:2, sums]).abs() / a[:2, sums]).max())
    big = torch.randn(256 * 2 ** 20, device="cuda", dtype=torch.bfloat16)  # 512 MiB
    big2d = big.view(-1, 4096)
    sbig, _, _ = block_scale(big2d, Blockwise(), "input", None, False)
    buf, plans = reset_template(1, "cuda"), {}
    gb = big.numel() * 2 / 1e6
    tiny = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    return {"variant": "check triton reduction", "ok": same and sqnr_rel < 1e-9, "sqnr_rel": sqnr_rel,
            "amax_GB/s": gb / bench_ms(lambda: torch.amax(big)),
            "kernel_GB/s": gb / bench_ms(lambda: launch(buf, 0, big, None, None, plans=plans)),
            "scaled_GB/s": gb / bench_ms(lambda: launch(buf, 0, big, scale, f, plans=plans)),
            "sqnr_GB/s": gb / bench_ms(lambda: launch(buf, 0, big, scale, f, sqnr=True, plans=plans)),
            "block_GB/s": gb / bench_ms(lambda: launch_blocks(buf, 0, big2d, sbig, blk, fb, plans=plans)),
            "torch_block_GB/s": gb / bench_ms(lambda: reduce_into(buf, 0, big2d, sbig, fb, kernel=False, block=blk)),
            "host_us": _host_us(lambda: launch(buf, 0, tiny, scale, f, plans=plans)),
            "host_jit_us": _host_us(lambda: launch(buf, 0, tiny, scale, f))}


# ---- cost ------------------------------------------------------------------------------------
def main():
    def extra(p):
        p.add_argument("--layers", type=int, default=None, help="decoder layers (default 8; --quick 2)")
        p.add_argument("--modes", default="compiled", help="compiled and/or eager steps")
        p.add_argument("--compile", choices=("whole", "regional"), default=None)
        p.add_argument("--rounds", type=int, default=None)
        p.add_argument("--dtypes", default="bf16,fp8")
        p.add_argument("--host-profile", action="store_true", help="print cProfile of the monitored compiled step")
    args = parse_args(__doc__, extra)
    if not torch.cuda.is_available():
        print("monitor.py needs a CUDA GPU")
        return 2
    import lowbit
    from torch._dynamo.utils import counters
    env = env_info()
    t_start = time.time()
    compile_mode = args.compile or ("regional" if args.quick else "whole")
    args.layers = args.layers or (2 if args.quick else 8)
    modes = [m for m in args.modes.split(",") if m]
    rounds = args.rounds or (2 if args.quick else 5)
    checks, rows, csv = [], [], []
    for mode in ("eager", "compiled", "graphs"):
        r = guarded(checks, f"check planted NaN ({mode})", lambda mode=mode: _planted(mode, args.out))
        if r:
            checks.append(r)
            print(r, flush=True)
    r = guarded(checks, "check triton reduction", _kernel_check)
    if r:
        checks.append(r)
        print(r, flush=True)
    for c in checks:
        if "ok" in c:
            csv.append(result_row(env, "monitor check", "2-layer Llama h256 / 8192x4096 bf16", c["variant"], "pass",
                                  float(bool(c["ok"]))))
        if c.get("host_syncs") is not None:
            csv.append(result_row(env, "monitor check", "2-layer Llama h256", "eager fwd+bwd", "host syncs",
                                  float(c["host_syncs"])))
        for key, what in (("kernel_GB/s", "triton stats (1 pass)"), ("scaled_GB/s", "triton stats with a scale (1 pass)"),
                          ("sqnr_GB/s", "triton stats with a scale and SQNR (1 pass)"),
                          ("block_GB/s", "triton stats with 1x128 scales (1 pass)"),
                          ("torch_block_GB/s", "torch ops with 1x128 scales (the fallback)")):
            if key in c:
                csv.append(result_row(env, "monitor stats kernel", "512 MiB bf16", what, "GB/s", c[key],
                                      "torch.amax(x)", c[key] / c["amax_GB/s"]))
        if "host_us" in c:
            csv.append(result_row(env, "monitor stats kernel", "2048 bf16, scaled", "host time a launch, kept plans",
                                  "us", c["host_us"], "the JIT's launch", c["host_jit_us"] / c["host_us"]))

    shape = f"{args.layers}L h4096 i14336 32/8 heads v128256, 2x4096 tokens, {compile_mode} compile"
    ids = torch.randint(0, 128256, (2, 4096), device="cuda")
    for dt in [d for d in args.dtypes.split(",") if d]:
        torch._dynamo.reset()
        model = llama(args.layers, 4096, 14336, 32, 8, 128256)
        if dt != "bf16":
            model = converted(model, dt)
            make_step(model, model, ids)()  # one eager step primes the delayed scales: one compile per variant

        def compiled():
            if compile_mode == "whole":
                return torch.compile(model)
            for layer in model.model.layers:
                layer.compile()
            return model
        plan = []
        if "compiled" in modes:
            plan += [("compiled", v) for v in ("none", "monitor every=1", "monitor every=1 sqnr_every=10",
                                               "detect_anomaly")]
        if "eager" in modes:
            plan += [("eager", v) for v in ("none", "monitor every=1", "detect_anomaly")]
        base, at, profiles = {}, {"mode": None}, {}
        fn = None
        for mode, variant in plan:
            row = {"variant": f"{dt} {mode} {variant}"}

            def run(mode=mode, variant=variant, row=row):
                nonlocal fn
                if at["mode"] != mode:
                    at["mode"] = mode
                    torch._dynamo.reset()
                    for layer in model.model.layers:
                        layer._compiled_call_impl = None  # undo a regional compilation
                    fn = compiled() if mode == "compiled" else model
                mon = None
                if variant.startswith("monitor"):
                    mon = lowbit.monitor(fn, on_anomaly="record", sqnr_every=10 if "sqnr" in variant else 0)
                step = make_step(model, fn, ids, mon)
                t0 = time.time()
                step()
                torch.cuda.synchronize()
                row["first_step_s"] = round(time.time() - t0, 1)
                if variant == "detect_anomaly":
                    with torch.autograd.detect_anomaly(check_nan=True):
                        ms = timed_ms(step, rounds)
                else:
                    ms = timed_ms(step, rounds)
                row["ms"] = ms
                row["peak_GiB"] = torch.cuda.max_memory_allocated() / 2 ** 30
                if mode == "compiled" and variant in ("none", "monitor every=1"):  # where the time goes
                    prof = kernel_profile(step, calls=3)
                    if prof:
                        row["device_ms"] = prof["ms"]
                        row["launches"] = prof["launches"]
                        row["stats_ms"] = sum(v for k, v in prof["kernels"].items() if "stats_kernel" in k)
                        profiles[variant] = prof["kernels"]
                    row["graphs"] = counters["stats"]["unique_graphs"]
                    row["graph_breaks"] = sum(counters["graph_break"].values())
                    row["host_ms"] = _issue_ms(step)
                    if variant != "none" and args.host_profile:
                        print(host_cprofile(step, calls=3, top=25), flush=True)
                if variant == "none":
                    base[mode] = ms
                row["ratio"] = ms / base[mode] if mode in base else None
                if mon is not None:
                    row["events"] = len(mon.events)
                    mon.detach()
                rows.append(row)
                csv.append(result_row(env, "llama train step + lowbit.monitor", shape, row["variant"], "ms", ms,
                                      f"{dt} {mode}, no monitor", row["ratio"]))
                for key, metric in (("device_ms", "device ms (profiled)"), ("stats_ms", "stats kernels device ms"),
                                    ("host_ms", "host ms to issue a step")):
                    if key in row:
                        csv.append(result_row(env, "llama train step + lowbit.monitor", shape, row["variant"], metric,
                                              row[key]))
                print(f"{row['variant']}: {ms:.2f} ms ratio {row['ratio']} (first step {row['first_step_s']} s, "
                      f"{time.time() - t_start:.0f} s so far)", flush=True)
            guarded(rows, row["variant"], run)
            torch.cuda.reset_peak_memory_stats()
        if len(profiles) == 2:  # the kernels the monitor adds or lengthens, largest first
            a, b = profiles["none"], profiles["monitor every=1"]
            diff = sorted(((b.get(k, 0.0) - a.get(k, 0.0), k) for k in set(a) | set(b)), reverse=True)
            print(f"{dt}: device ms the monitor adds per step, by kernel:")
            for d, k in diff[:12]:
                print(f"  {d:+8.3f}  {k[:110]}")
        fn = model = None  # free the model before the next one is built
        torch.cuda.empty_cache()

    append_results(csv, args.out)
    write_json(args.out, "monitor", {"env": env, "checks": checks, "rows": rows, "shape": shape})
    print(env)
    print_table(checks, ["variant", "ok", "first_nonfinite", "host_syncs", "kernel_GB/s", "scaled_GB/s", "sqnr_GB/s",
                         "block_GB/s", "torch_block_GB/s", "amax_GB/s", "sqnr_rel", "host_us", "host_jit_us", "error"])
    print_table(rows, ["variant", "ms", "ratio", "peak_GiB", "first_step_s", "events", "device_ms", "host_ms", "stats_ms",
                       "launches", "graphs", "graph_breaks", "error"])
    print(f"total {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
