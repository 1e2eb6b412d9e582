"""The training step users see: HF ``LlamaForCausalLM`` from config, bf16 vs lowbit vs torchao.

    python benchmarks/step.py --out DIR [--quick] [--workloads 85m,8b2,8b8] [--formats fp8,mxfp8|all]
                              [--modes eager,compiled,reduce-overhead] [--steps N] [--torchao tensorwise,rowwise]

Workloads (random weights from the config, random tokens, ``labels = input_ids``):

=========  ==================================================================  ==============
``8b8``    8 layers of Llama-3-8B shape: d 4096, FFN 14336, 32 heads, 8 KV      2 x 4096 tokens
           heads, vocab 128256
``8b2``    the same with 2 layers                                               2 x 4096 tokens
``85m``    d 768, 8 layers, 12 heads, FFN 3072, vocab 32000                     32 x 512 tokens
``tiny``   d 64, 2 layers, 4 heads (2 KV), FFN 128, vocab 256; fp32, for the    2 x 32 tokens
           CPU (the torch emulation is exact, not fast: a smoke test)
=========  ==================================================================  ==============

Parameters are bf16 (fp32 for ``tiny``), as torchao's float8 example does (``.bfloat16()`` model,
no autocast); SDPA attention; no KV cache. The optimizer is AdamW (fused on CUDA) on those
parameters. One step = forward with the HF loss, backward, ``opt.step()``, ``opt.zero_grad()``.

Variants: the high-precision model (``bf16`` / ``fp32``, the anchor); ``lowbit.convert(model,
fmt)`` with its defaults for each ``--formats`` name (``all``: every ``lowbit.convert.FORMATS``
name); ``torchao-tensorwise`` / ``torchao-rowwise`` when torchao is installed:
``convert_to_float8_training(model)`` with its default filter (every ``nn.Linear``, the LM head
too) and the recipe's default config, as a torchao user would. Modes: ``eager``, ``compiled``
(``torch.compile(model)``), ``reduce-overhead`` (``torch.compile(model, mode="reduce-overhead")``:
inductor's CUDA graphs; the number of graphs inductor declined, ``cudagraph_skips``, is recorded
with the reasons it logged).

Per variant: ``check`` steps on fixed batches whose losses are compared with the anchor's in the
same mode (relative difference at most ``LOSS_TOL`` of the format family: a sanity check that
the model trains, not a convergence study; these steps also compile), ``warmup`` more steps, then
``--steps`` timed steps, each between two CUDA events (the median is reported; wall clock on the
CPU). Peak memory is ``torch.cuda.max_memory_allocated`` over the timed steps (``peak_GiB``, the
steady state) and, apart, from the model's construction to the end of the warm-up
(``peak_first_GiB``: compilation, autotuning and the optimizer's first step included). A
failing variant is recorded with its error and the script goes on;
memory and compile caches are freed between variants. SIGTERM (a ``timeout``) stops the run and
still writes the rows and table of every variant measured before it.

Rows (``benchmarks/results.csv`` via ``common.append_results``): ``step_ms`` and ``peak_GiB``
against the anchor and against ``torchao-tensorwise`` in the same workload and mode;
``ratio > 1`` means better than the anchor (faster: anchor_ms / ms; smaller: anchor_GiB / GiB);
``loss`` after the timed steps; ``loss_rel_diff`` (the check); ``first_step_s`` (compile time
included); ``cudagraph_skips`` in reduce-overhead mode. ``DIR/step.json`` holds every row and
the table printed last. ``--profile``: each variant's device time of 2 more steps by kernel group
and its top kernels (in step.json, and printed after the table).
"""
from __future__ import annotations

import dataclasses
import gc
import logging
import os
import signal
import statistics
import sys
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.common import (append_results, env_info, guarded, parse_args, print_table,  # noqa: E402
                               result_row, write_json)


@dataclasses.dataclass(frozen=True)
class Workload:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    batch: int
    seq: int
    dtype: torch.dtype = torch.bfloat16

    @property
    def shape(self) -> str:
        return (f"d{self.hidden} ffn{self.intermediate} L{self.layers} h{self.heads}/{self.kv_heads} "
                f"V{self.vocab} {self.batch}x{self.seq} {str(self.dtype).replace('torch.', '')}")


WORKLOADS: Dict[str, Workload] = {
    "8b8": Workload(4096, 14336, 8, 32, 8, 128256, 2, 4096),
    "8b2": Workload(4096, 14336, 2, 32, 8, 128256, 2, 4096),
    "85m": Workload(768, 3072, 8, 12, 12, 32000, 32, 512),
    "tiny": Workload(64, 128, 2, 4, 2, 256, 2, 32, torch.float32),
}
MODES = ("eager", "compiled", "reduce-overhead")
TORCHAO_NAMES = ("torchao-tensorwise", "torchao-rowwise")
TORCHAO = TORCHAO_NAMES[0]
LOSS_TOL = {"8bit": 0.02, "4bit": 0.05}  # |loss - anchor loss| / anchor loss over the check steps
LR = 1e-3


def anchor_name(w: Workload) -> str:
    return {torch.bfloat16: "bf16", torch.float32: "fp32"}[w.dtype]


def build_model(w: Workload, device: str) -> torch.nn.Module:
    """The same random weights for every variant (seed 0)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=w.hidden, intermediate_size=w.intermediate, num_hidden_layers=w.layers,
                      num_attention_heads=w.heads, num_key_value_heads=w.kv_heads, vocab_size=w.vocab,
                      max_position_embeddings=w.seq, use_cache=False, tie_word_embeddings=False,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    return model.to(w.dtype).train()


def make_variant(model: torch.nn.Module, name: str, all_layers: bool = False, head: bool = False) -> torch.nn.Module:
    """``all_layers``: lowbit converts every Linear but the head (``filter=``), not only those the
    size rule of ``lowbit.convert``'s default filter keeps; ``head``: the output head too (with the
    size rule unless ``all_layers``), the coverage of torchao's default filter."""
    if name in ("bf16", "fp32"):
        return model
    if name.startswith("torchao-"):
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        recipe = name.split("-", 1)[1]
        cfg = None if recipe == "tensorwise" else Float8LinearConfig.from_recipe_name(recipe)
        return convert_to_float8_training(model, config=cfg)
    import lowbit
    from lowbit.convert import HEAD_NAMES, recipe_for
    from lowbit.sizing import size_problem
    recipe = recipe_for(name)
    keep = None
    if all_layers or head:
        def keep(fqn, mod):
            if fqn.rsplit(".", 1)[-1] in HEAD_NAMES:
                return head
            return all_layers or size_problem(recipe, mod.in_features, mod.out_features, mod.weight.device) is None
    return lowbit.convert(model, name, filter=keep)


def converted(model: torch.nn.Module) -> str:
    """``"converted/Linear layers"`` (lowbit or torchao layers among the model's Linears)."""
    lins = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    low = [m for m in lins if type(m) is not torch.nn.Linear]
    return f"{len(low)}/{len(lins)}"


def loss_tol(name: str) -> float:
    return LOSS_TOL["4bit"] if name in ("mxfp4", "nvfp4") else LOSS_TOL["8bit"]


class SkipRecorder(logging.Handler):
    """Collects inductor's "skipping cudagraphs due to ..." messages: on the ``torch._inductor``
    logger, which every inductor module's cudagraphs logger propagates to (on that logger itself
    where it does not propagate)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.reasons: List[str] = []
        self.logger: Optional[logging.Logger] = None

    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith("skipping cudagraphs"):
            self.reasons.append(msg.splitlines()[0][:200])

    def install(self) -> "SkipRecorder":
        from torch._inductor import cudagraph_utils
        log = cudagraph_utils.cudagraphs_log
        self.logger = logging.getLogger("torch._inductor") if log.propagate else log
        self.logger.addHandler(self)
        return self

    def uninstall(self) -> None:
        self.logger.removeHandler(self)


class Clock:
    """Per-step times in ms: CUDA events on the GPU, wall clock on the CPU."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.marks = []

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def intervals_ms(self) -> List[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]


class TimeLimit(BaseException):
    """SIGTERM (what ``timeout`` sends) during a run: not an ``Exception``, so ``guarded`` lets it
    through to ``main``, which writes the rows of every variant already measured."""


def _on_sigterm(signum, frame):
    raise TimeLimit(f"signal {signum}")


def free_memory(device: str) -> None:
    torch._dynamo.reset()
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_variant(workload: str, name: str, mode: str, args, batches, recorder: Optional[SkipRecorder],
                anchor_losses: List[float]) -> dict:
    """One (variant, mode): the row of the printed table (ms, GiB, losses, compile facts). The
    anchor fills ``anchor_losses`` with its check losses; the other variants are compared with them."""
    from torch._dynamo.utils import counters
    w, device = WORKLOADS[workload], args.device
    cuda = device.startswith("cuda")
    free_memory(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    model = make_variant(build_model(w, device), name, args.all_layers, args.head)
    fn = {"eager": lambda: model, "compiled": lambda: torch.compile(model),
          "reduce-overhead": lambda: torch.compile(model, mode="reduce-overhead")}[mode]()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, fused=cuda)
    skips0, n_reasons = counters["inductor"]["cudagraph_skips"], len(recorder.reasons) if recorder else 0

    def step(i: int) -> torch.Tensor:
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        ids = batches[i % len(batches)]
        loss = fn(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    row = {"workload": workload, "variant": name, "mode": mode, "converted": converted(model)}
    t0 = time.perf_counter()
    losses = [step(0).item()]
    row["first_step_s"] = time.perf_counter() - t0
    losses += [step(i).item() for i in range(1, args.check)]
    row["loss0"] = losses[0]
    if name == anchor_name(w):
        anchor_losses[:] = losses
    elif anchor_losses:
        row["loss_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(losses, anchor_losses))
        row["loss_ok"] = row["loss_rel_diff"] <= loss_tol(name)
    for i in range(args.warmup):
        step(args.check + i)
    if cuda:
        row["GiB_compile"] = torch.cuda.max_memory_allocated() / 2 ** 30  # construction, compile, check, warm-up
        torch.cuda.reset_peak_memory_stats()
    clock = Clock(device)
    clock.mark()
    for i in range(args.steps):
        last = step(args.check + args.warmup + i)
        clock.mark()
    row["loss"] = last.item()
    row["ms"] = statistics.median(clock.intervals_ms())
    if cuda:
        row["GiB"] = torch.cuda.max_memory_allocated() / 2 ** 30  # the timed steps alone
        if args.profile:
            row["profile"] = kernel_profile(lambda i: step(args.check + args.warmup + args.steps + i))
    if mode == "reduce-overhead":
        row["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"] - skips0
        if recorder:
            row["skip_reasons"] = " | ".join(recorder.reasons[n_reasons:]) or None
    return row


def kernel_profile(step, steps: int = 2, top: int = 12) -> dict:
    """Device time of ``steps`` steps under ``torch.profiler``, a step: per kernel group
    (``ffn_profile.GROUPS``) and the ``top`` kernels."""
    from benchmarks.ffn_profile import group_of
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for i in range(steps):
            step(i)
        torch.cuda.synchronize()
    kernels: Dict[str, List[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name, [0.0, 0])
            k[0] += e.device_time_total / steps / 1e3
            k[1] += 1 / steps
    groups: Dict[str, float] = {}
    for name, (ms, _) in kernels.items():
        low = name.lower()
        g = ("attention" if any(s in low for s in ("flash", "sdpa", "fmha", "attn", "attention")) else
             "optimizer" if any(s in low for s in ("adam", "multi_tensor")) else group_of(name))
        groups[g] = groups.get(g, 0.0) + ms
    return {"device_ms": sum(v[0] for v in kernels.values()), "groups": groups,
            "top": [(name[:90], ms, n) for name, (ms, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]]}


def print_profiles(table: List[dict]) -> None:
    for r in table:
        prof = r.pop("profile", None)
        if prof:
            print(f"\n{r['workload']} {r['mode']} {r['variant']}: {prof['device_ms']:.1f} ms of kernels a step; "
                  + ", ".join(f"{g} {ms:.1f}" for g, ms in sorted(prof["groups"].items(), key=lambda kv: -kv[1])))
            for name, ms, n in prof["top"]:
                print(f"  {ms:7.2f} ms {n:5.0f}x  {name}")


def reference(table: List[dict], row: dict, variant: str) -> Optional[dict]:
    """The measured row of ``variant`` in ``row``'s workload and mode (None if absent or failed)."""
    return next((x for x in table if x.get("workload") == row.get("workload") and x.get("mode") == row.get("mode")
                 and x.get("variant") == variant and "ms" in x), None)


def result_rows(env: dict, table: List[dict], w: Workload, all_layers: bool, head: bool = False) -> List[dict]:
    """The results.csv rows of one workload's table, with ratios against the anchor and torchao
    tensorwise in the same mode (``ratio > 1``: better than the anchor)."""
    rows = []
    anchor = anchor_name(w)
    for r in table:
        if "ms" not in r:
            continue
        lowbit_fmt = r["variant"] not in (anchor, *TORCHAO_NAMES)
        cover = (" all-layers" if all_layers else "") + (" +head" if head else "") if lowbit_fmt else ""
        variant = f"{'lowbit ' if lowbit_fmt else ''}{r['variant']}{cover} {r['mode']}"
        for metric, key in (("step_ms", "ms"), ("peak_GiB", "GiB"), ("peak_first_GiB", "GiB_compile")):
            if key not in r:
                continue
            rows.append(result_row(env, r["workload"], w.shape, variant, metric, r[key]))
            for a in (anchor, TORCHAO):
                ref = reference(table, r, a)
                if ref is not None and ref is not r and key in ref:
                    rows.append(result_row(env, r["workload"], w.shape, variant, metric, r[key], anchor=a,
                                           ratio=ref[key] / r[key]))
        for metric in ("loss", "loss_rel_diff", "first_step_s", "cudagraph_skips"):
            if r.get(metric) is not None:
                rows.append(result_row(env, r["workload"], w.shape, variant, metric, float(r[metric]),
                                       anchor=anchor if metric == "loss_rel_diff" else ""))
        ref, tao = reference(table, r, anchor), reference(table, r, TORCHAO)
        r["vs_anchor"] = ref["ms"] / r["ms"] if ref else None
        r["vs_torchao"] = tao["ms"] / r["ms"] if tao else None
    return rows


def variants(args, w: Workload) -> List[str]:
    from lowbit.convert import FORMATS
    fmts = list(FORMATS) if args.formats == "all" else [f for f in args.formats.split(",") if f]
    unknown = [f for f in fmts if f not in FORMATS]
    if unknown:
        raise SystemExit(f"unknown formats {unknown}; choose from {list(FORMATS)} or 'all'")
    names = [anchor_name(w)] + fmts
    tao = [f"torchao-{r}" for r in args.torchao.split(",") if r]
    if set(tao) - set(TORCHAO_NAMES):
        raise SystemExit(f"unknown torchao recipes {sorted(set(tao) - set(TORCHAO_NAMES))}: tensorwise, rowwise")
    if args.device.startswith("cuda") and tao:
        try:
            import torchao  # noqa: F401
            names += tao
        except ImportError:
            print("torchao not installed: its variants are not measured")
    return names


def add_options(p) -> None:
    p.add_argument("--workloads", default="85m,8b2,8b8", help=f"comma list of {list(WORKLOADS)}")
    p.add_argument("--formats", default=None, help="lowbit formats, or 'all' (default fp8,fp8-block,mxfp8,nvfp4; "
                                                   "--quick: fp8,fp8-block,mxfp8)")
    p.add_argument("--modes", default="eager,compiled", help=f"comma list of {list(MODES)}")
    p.add_argument("--torchao", default=None, help="torchao float8 recipes, '' for none (default tensorwise,rowwise; "
                                                   "--quick: tensorwise)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20, --quick 8)")
    p.add_argument("--all-layers", action="store_true", help="lowbit converts every Linear but the head "
                                                                 "(no size rule)")
    p.add_argument("--head", action="store_true", help="lowbit converts the output head too (torchao's coverage)")
    p.add_argument("--profile", action="store_true", help="also profile 2 steps a variant: device time by "
                                                            "kernel group and the top kernels (printed last)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")


def main() -> List[dict]:
    args = parse_args(__doc__.splitlines()[0], add_options)
    args.steps = args.steps or (8 if args.quick else 20)
    if args.formats is None:
        args.formats = "fp8,fp8-block,mxfp8" if args.quick else "fp8,fp8-block,mxfp8,nvfp4"
    if args.torchao is None:
        args.torchao = "tensorwise" if args.quick else "tensorwise,rowwise"
    args.check, args.warmup = (2, 2) if args.quick else (3, 5)
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(MODES):
        raise SystemExit(f"unknown modes {sorted(set(modes) - set(MODES))}; choose from {MODES}")
    recorder = SkipRecorder().install() if "reduce-overhead" in modes else None
    env = env_info()
    table, rows = [], []
    workloads = [x for x in args.workloads.split(",") if x]
    if set(workloads) - set(WORKLOADS):
        raise SystemExit(f"unknown workloads {sorted(set(workloads) - set(WORKLOADS))}; choose from {list(WORKLOADS)}")
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        for workload in workloads:
            w = WORKLOADS[workload]
            g = torch.Generator().manual_seed(1)
            batches = [torch.randint(0, w.vocab, (w.batch, w.seq), generator=g).to(args.device) for _ in range(2)]
            wtable: List[dict] = []
            table.append(wtable)
            for mode in modes:
                anchor_losses: List[float] = []
                for name in variants(args, w):
                    row = guarded(wtable, f"{name} {mode}", lambda: run_variant(workload, name, mode, args, batches,
                                                                                 recorder, anchor_losses))
                    if row is not None:
                        wtable.append(row)
                    else:
                        wtable[-1].update(workload=workload, mode=mode, variant=name)
                    last = wtable[-1]
                    print(f"{workload} {mode} {name}: " + ", ".join(f"{k}={v}" for k, v in last.items()
                                                                       if k not in ("workload", "mode", "variant")),
                          flush=True)
                    free_memory(args.device)
    except TimeLimit as e:  # the variants measured so far keep their rows
        print(f"stopped by {e}: writing the rows measured so far", flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    for wtable in table:
        if wtable:
            rows += result_rows(env, wtable, WORKLOADS[wtable[0]["workload"]], args.all_layers, args.head)
    table = [r for wtable in table for r in wtable]
    append_results(rows, args.out)
    write_json(args.out, "step", {"env": env, "table": table, "rows": rows})
    print_profiles(table)
    print(env)
    print_table(table, ["workload", "mode", "variant", "converted", "ms", "vs_anchor", "vs_torchao", "GiB", "GiB_compile",
                        "loss", "loss_rel_diff",
                        "loss_ok", "first_step_s", "cudagraph_skips", "skip_reasons", "error"])
    return rows


if __name__ == "__main__":
    main()
