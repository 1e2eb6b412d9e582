"""What ``lowbit.monitor`` costs, and that it finds what it should, on one GPU.

    python benchmarks/monitor.py --out DIR [--quick] [--layers 8] [--compile whole|regional]
                                 [--dtypes bf16,fp8] [--modes compiled,eager] [--rounds 5]

Checks first (a 2-layer Llama of hidden 256, bf16, on the GPU):
* a NaN planted in one weight, and one made in another module's backward, are named exactly
  (module, phase, step), eager, compiled (inductor) and compiled with CUDA graphs
  (``mode="reduce-overhead"``: the records write the static buffer in place, so the replays record);
* no host sync inside a monitored forward + backward (``torch.cuda.set_sync_debug_mode("warn")``,
  warnings counted, eager);
* the Triton reduction gives the torch ops' figures (all columns but the clock) at every launch
  of ``SWEEP``, and each launch's read bandwidth (bf16, 512 / 64 / 16 MiB, with and without a
  scale) beside torch's one-read ``x.amax()``; the fastest at 64 MiB is also timed in the step.

Then the cost: the training step (forward with labels, backward, grads set to None; no optimizer,
so the ratio is against the smallest step) of a Hugging Face Llama with ``--layers`` decoder layers
of Llama-3-8B shape (hidden 4096, intermediate 14336, 32 heads, 8 KV heads, vocab 128256), 2 x 4096
tokens, bf16 and lowbit "fp8", compiled (``--compile whole``: ``torch.compile(model)``;
``regional``: each decoder layer compiled in place, one compile shared by all): no monitor,
``lowbit.monitor(every=1)`` (``mon.step()`` inside the timed step), ``sqnr_every=10``, and
``torch.autograd.detect_anomaly`` (no monitor); with ``--modes compiled,eager`` also eager: no
monitor, every=1, detect_anomaly. Targets: every=1 <= 1.03x, SQNR every 10 <= 1.05x of no
monitor, compiled. Attaching and detaching a monitor resets Dynamo, so every compiled variant
compiles anew (and under regional compilation each watched layer compiles on its own: its rows
are constants of its graph). Each figure: median over rounds of (10 steps timed with CUDA events)
/ 10, after 3 warm-up steps (the first step's seconds are recorded too). ``--quick``: 2 layers,
regional compile, 2 rounds (within 4 minutes on an H200). The full run is one command per dtype
(about 6-8 minutes each, mostly compiling): ``--dtypes bf16``, then ``--dtypes fp8``.
"""
from __future__ import annotations

import functools
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from common import (append_results, bench_ms, env_info, guarded, kernel_profile, parse_args,  # noqa: E402
                    print_table, result_row, write_json)


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


def fp8(model):
    import lowbit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the output head stays in bf16
        return lowbit.convert(model, "fp8")


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


SWEEP = ((4096, 1, 8, 4), (4096, 2, 8, 4), (4096, 4, 8, 4), (2048, 4, 4, 8), (2048, 2, 4, 8), (1024, 4, 4, 16),
         (8192, 1, 8, 4), (4096, 2, 8, 8), (2048, 4, 8, 4))  # (block, unroll, warps, programs an SM)


def _kernel_check(sweep_rows: list) -> dict:
    """The kernel's figures against the torch reduction (every launch of ``SWEEP``), then each
    launch's read bandwidth on bf16 tensors of 512, 64 and 16 MiB (with and without a scale) beside
    torch's one-read ``x.amax()``; returns the check with the fastest launch at 64 MiB unscaled."""
    from lowbit.dtypes.formats import get_format
    from lowbit.monitor.stats import COL, reduce_into, reset_template
    from lowbit.monitor.stats_kernel import DEFAULT, StatsLaunch, launch
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16) * 30
    x[5, 7], x[9, 1] = float("nan"), float("inf")
    scale = torch.tensor(0.05, device="cuda")
    f = get_format("e4m3")
    ref = reset_template(2, "cuda")
    reduce_into(ref, 0, x, scale, f, kernel=False)
    reduce_into(ref, 1, x[:4097])
    cols = [c for n, c in COL.items() if n != "seq"]
    configs = [StatsLaunch(*c) for c in SWEEP]
    same = True
    for cfg in configs:
        got = reset_template(2, "cuda")
        launch(got, 0, x, scale, f, config=cfg)
        launch(got, 1, x[:4097], None, None, config=cfg)
        same &= bool(torch.equal(ref[:2, cols], got[:2, cols]))
    best = {}
    for mib in (512, 64, 16):
        big = torch.randn(mib * 2 ** 19, device="cuda", dtype=torch.bfloat16)
        gb = big.numel() * 2 / 1e6
        amax_gbs = gb / bench_ms(lambda: torch.amax(big))
        buf = reset_template(1, "cuda")
        for cfg in configs:
            for sc in (None, scale):
                ms = bench_ms(lambda: launch(buf, 0, big, sc, f if sc is not None else None, config=cfg))
                row = {"variant": f"stats {mib} MiB{' scaled' if sc is not None else ''} {tuple(vars(cfg).values())}",
                       "GB/s": gb / ms, "amax_GB/s": amax_gbs, "vs_amax": gb / ms / amax_gbs, "mib": mib,
                       "scaled": sc is not None, "launch": cfg, "default": cfg == DEFAULT}
                sweep_rows.append(row)
                if mib == 64 and sc is None and row["GB/s"] > best.get("GB/s", 0):
                    best = row
        del big
    dflt = next(r for r in sweep_rows if r["default"] and r["mib"] == 512 and not r["scaled"])
    return {"variant": "check triton reduction", "ok": same, "kernel_GB/s": dflt["GB/s"],
            "amax_GB/s": dflt["amax_GB/s"], "best": best["launch"]}


# ---- cost ------------------------------------------------------------------------------------
def main():
    def extra(p):
        p.add_argument("--layers", type=int, default=None, help="decoder layers (default 8; --quick 2)")
        p.add_argument("--modes", default="compiled", help="compiled and/or eager steps")
        p.add_argument("--compile", choices=("whole", "regional"), default=None)
        p.add_argument("--rounds", type=int, default=None)
        p.add_argument("--dtypes", default="bf16,fp8")
    args = parse_args(__doc__, extra)
    if not torch.cuda.is_available():
        print("monitor.py needs a CUDA GPU")
        return 2
    import lowbit
    from torch._dynamo.utils import counters
    from lowbit.monitor import stats_kernel
    from lowbit.monitor.stats_kernel import DEFAULT
    default_launch = stats_kernel.launch
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
    sweep = []
    r = guarded(checks, "check triton reduction", lambda: _kernel_check(sweep))
    best = None
    if r:
        checks.append(r)
        print(r, flush=True)
        best = r["best"] if r["ok"] else None
    for c in checks:
        if "ok" in c:
            csv.append(result_row(env, "monitor check", "2-layer Llama h256 / 8192x4096 bf16", c["variant"], "pass",
                                  float(bool(c["ok"]))))
        if c.get("host_syncs") is not None:
            csv.append(result_row(env, "monitor check", "2-layer Llama h256", "eager fwd+bwd", "host syncs",
                                  float(c["host_syncs"])))
    for w in sweep:
        csv.append(result_row(env, "monitor stats kernel", f"{w['mib']} MiB bf16{', scaled' if w['scaled'] else ''}",
                              f"launch {tuple(vars(w['launch']).values())} (block, unroll, warps, programs/SM)",
                              "GB/s", w["GB/s"], "torch.amax(x)", w["vs_amax"]))

    shape = f"{args.layers}L h4096 i14336 32/8 heads v128256, 2x4096 tokens, {compile_mode} compile"
    ids = torch.randint(0, 128256, (2, 4096), device="cuda")
    for dt in [d for d in args.dtypes.split(",") if d]:
        torch._dynamo.reset()
        model = llama(args.layers, 4096, 14336, 32, 8, 128256)
        if dt == "fp8":
            model = fp8(model)
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
            if best is not None and best != DEFAULT:
                plan.insert(2, ("compiled", f"monitor every=1 launch {tuple(vars(best).values())}"))
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
                stats_kernel.launch = functools.partial(default_launch, config=best) if "launch" in variant \
                    else default_launch  # (the sweep's fastest launch, for this variant only)
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
                if variant == "none":
                    base[mode] = ms
                row["ratio"] = ms / base[mode] if mode in base else None
                if mon is not None:
                    row["events"] = len(mon.events)
                    mon.detach()
                rows.append(row)
                csv.append(result_row(env, "llama train step + lowbit.monitor", shape, row["variant"], "ms", ms,
                                      f"{dt} {mode}, no monitor", row["ratio"]))
                for key, metric in (("device_ms", "device ms (profiled)"), ("stats_ms", "stats kernels device ms")):
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
    print_table(sweep, ["variant", "GB/s", "vs_amax"])
    print_table(checks, ["variant", "ok", "first_nonfinite", "host_syncs", "kernel_GB/s",
                         "amax_GB/s", "best", "error"])
    print_table(rows, ["variant", "ms", "ratio", "peak_GiB", "first_step_s", "events", "device_ms", "stats_ms",
                       "launches", "graphs", "graph_breaks", "error"])
    print(f"total {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
