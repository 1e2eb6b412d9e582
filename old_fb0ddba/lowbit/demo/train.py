"""One demo run per format: same initial weights (seed), same batches in the same order, same
optimizer (AdamW, warmup then cosine decay), same compute dtype around the Linear layers. The
baseline keeps plain ``nn.Linear``; every other run is ``lowbit.convert(model, fmt)``.

Baseline (``baseline=None`` picks): ``"bf16"`` (everything under ``torch.autocast(bfloat16)``) on
CUDA; ``"fp32"`` (no autocast) on the CPU, where bf16 matmuls are emulated and ~8x slower than
fp32 on common laptop CPUs without bf16 instructions. ``baseline="bf16"`` forces bf16 on a CPU.

Reported per run: the loss curve, the final loss (mean training loss over the last 10% of steps),
the held-out loss at the end, tokens/s (wall clock, excluding the first 4 steps: warm-up and
graph capture), peak memory (CUDA: ``max_memory_allocated``; CPU: not measured) and any error (a
failing format is recorded and the demo goes on).

Seeds: with ``seeds=n`` every format trains from seeds ``seed .. seed+n-1`` (initial weights and
data order both change with the seed; seed ``s`` is the same for every format). A format's row
then holds the mean final loss, the per-seed final losses and their sample standard deviation, and
the mean loss curve; its gap is ``100 (mean_fmt - mean_base) / mean_base`` (``report.table`` adds
the standard error of the paired per-seed gaps). Two runs of the same format from different seeds
differ by a few tenths of a percent to a few percent at demo lengths (on the GPU even two runs of
one seed do), so one seed cannot resolve a 0.5% gap.

On CUDA the step is replayed from a CUDA graph (``step.py``) unless ``graph=False`` or the format
rounds gradients stochastically (NVFP4), which keeps it eager.
"""
from __future__ import annotations

import math
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from .corpus import load_corpus, split
from .model import GPT, SIZES
from .step import TrainStep, make_optimizer, set_lr

__all__ = ["DemoConfig", "run_demo", "train_one", "DEFAULT_STEPS", "DEFAULT_BATCH"]

DEFAULT_STEPS = {"tiny": 150, "small": 400, "50m": 1000}
DEFAULT_BATCH = {"tiny": 16, "small": 32, "50m": 32}
DEFAULT_LR = {"tiny": 3e-3, "small": 2e-3, "50m": 1e-3}
DEFAULT_CORPUS = {"tiny": 2_000_000, "small": 4_000_000, "50m": 16_000_000}  # 50m: all (~11 MB) of it


@dataclass
class DemoConfig:
    formats: Sequence[str] = ("fp8",)
    size: str = "tiny"
    steps: Optional[int] = None
    batch: Optional[int] = None
    lr: Optional[float] = None
    seed: int = 0
    device: Optional[str] = None
    corpus_bytes: Optional[int] = None
    backend: str = "auto"
    baseline: Optional[str] = None
    progress: bool = True
    val_batches: int = 8
    extra: dict = field(default_factory=dict)
    seeds: int = 1
    graph: Optional[bool] = None

    def resolved(self) -> "DemoConfig":
        if self.size not in SIZES:
            raise ValueError(f"unknown size {self.size!r}; choose one of {sorted(SIZES)}")
        from ..convert import FORMATS
        bad = [f for f in self.formats if f not in FORMATS and f not in ("bf16", "fp32")]
        if bad:
            raise ValueError(f"unknown format(s) {bad}; choose from {sorted(FORMATS)}")
        dev = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        base = self.baseline or ("bf16" if torch.device(dev).type == "cuda" else "fp32")
        if base not in ("bf16", "fp32"):
            raise ValueError(f"baseline must be 'bf16' or 'fp32', got {base!r}")
        return DemoConfig(tuple(self.formats), self.size, self.steps or DEFAULT_STEPS[self.size],
                          self.batch or DEFAULT_BATCH[self.size], self.lr or DEFAULT_LR[self.size], self.seed, dev,
                          self.corpus_bytes or DEFAULT_CORPUS[self.size],
                          self.backend, base, self.progress, self.val_batches, dict(self.extra),
                          max(1, int(self.seeds)), self.graph)


def _lr(step: int, total: int, base: float) -> float:
    warm = max(1, total // 20)
    if step < warm:
        return base * (step + 1) / warm
    t = (step - warm) / max(1, total - warm)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _batch(data: torch.Tensor, starts: torch.Tensor, T: int, device):
    idx = starts[:, None] + torch.arange(T + 1)
    chunk = data[idx].long().to(device)
    return chunk[:, :-1], chunk[:, 1:]


class _Progress:
    def __init__(self, name: str, total: int, enabled: bool):
        self.name, self.total, self.enabled, self.last = name, total, enabled, 0.0

    def update(self, i: int, loss: Callable[[], float], tps: float) -> None:
        now = time.time()
        if not self.enabled or (now - self.last < 0.2 and i + 1 < self.total):
            return
        self.last = now
        done = int(30 * (i + 1) / self.total)
        sys.stderr.write(f"\r{self.name:>12} [{'#' * done}{'.' * (30 - done)}] {i + 1}/{self.total} "
                         f"loss {loss():.3f} {tps:,.0f} tok/s")
        if i + 1 == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _capturable(fmt: str) -> bool:
    from ..convert import recipe_for
    return fmt in ("bf16", "fp32") or not getattr(recipe_for(fmt), "sr_grads", False)


def train_one(fmt: str, cfg: DemoConfig, train_data, val_data, seed: Optional[int] = None) -> dict:
    """Train one model in ``fmt`` (the baseline's name or a lowbit format) from ``seed`` (default
    ``cfg.seed``); returns its row."""
    import lowbit
    seed = cfg.seed if seed is None else seed
    dev = torch.device(cfg.device)
    gcfg = SIZES[cfg.size]
    torch.manual_seed(seed)
    model = GPT(gcfg).to(dev)
    n_conv = 0
    if fmt not in ("bf16", "fp32"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the output head stays in high precision, as documented
            lowbit.convert(model, fmt, backend=cfg.backend)
        n_conv = sum(isinstance(m, lowbit.nn.LowbitModule) for m in model.modules())
    opt = make_optimizer(model, cfg.lr, dev)
    g = torch.Generator().manual_seed(seed + 1)  # the data order: the same for every format
    T, B = gcfg.seq_len, cfg.batch
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    bar = _Progress(fmt, cfg.steps, cfg.progress)
    amp = cfg.baseline == "bf16"
    graph = (dev.type == "cuda" if cfg.graph is None else cfg.graph) and _capturable(fmt)
    train_step = TrainStep(model, opt, amp, dev, graph)
    losses, t0, tokens = [], None, 0
    for step in range(cfg.steps):
        if step == 4:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0, tokens = time.time(), 0
        x, y = _batch(train_data, torch.randint(0, len(train_data) - T - 1, (B,), generator=g), T, dev)
        set_lr(opt, _lr(step, cfg.steps, cfg.lr))
        losses.append(train_step(x, y))  # no host sync per step; read when the bar redraws
        tokens += B * T
        elapsed = time.time() - t0 if t0 else 0.0
        bar.update(step, lambda: losses[-1].item(), tokens / elapsed if elapsed > 0 else 0.0)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    tps = tokens / (time.time() - t0) if t0 else float("nan")
    gv = torch.Generator().manual_seed(cfg.seed + 2)  # one held-out set for every seed
    losses = torch.stack(losses).float().tolist()
    with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
        val = [float(model(*_batch(val_data, torch.randint(0, len(val_data) - T - 1, (B,), generator=gv), T, dev)))
               for _ in range(cfg.val_batches)]
    tail = losses[-max(1, len(losses) // 10):]
    return {"format": fmt, "losses": losses, "final_loss": sum(tail) / len(tail), "val_loss": sum(val) / len(val),
            "tokens_per_s": tps, "peak_mem_mb": torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else None,
            "params": model.n_params(), "converted_layers": n_conv, "seed": seed,
            "graph": train_step.graph is not None, "graph_error": train_step.graph_error, "error": None}


def _over_seeds(rows: list) -> dict:
    """One row for a format trained from several seeds: means, per-seed finals, their std."""
    bad = [r for r in rows if r.get("error")]
    if bad:
        return {**bad[0], "per_seed": rows}
    n = len(rows)
    mean = lambda k: sum(r[k] for r in rows) / n  # noqa: E731
    finals = [r["final_loss"] for r in rows]
    std = (sum((f - mean("final_loss")) ** 2 for f in finals) / (n - 1)) ** 0.5
    curve = [sum(v) / n for v in zip(*(r["losses"] for r in rows))]
    return {**rows[0], "losses": curve, "final_loss": mean("final_loss"), "val_loss": mean("val_loss"),
            "tokens_per_s": mean("tokens_per_s"), "seed": None, "seeds": [r["seed"] for r in rows],
            "final_losses": finals, "final_std": std, "graph": all(r["graph"] for r in rows)}


def run_demo(cfg: DemoConfig, on_result: Optional[Callable[[dict], None]] = None) -> dict:
    """Train bf16 and every format in ``cfg.formats``; returns {"config": ..., "runs": [rows]}."""
    cfg = cfg.resolved()
    data = load_corpus(cfg.corpus_bytes)
    train_data, val_data = split(data)
    runs = []
    for fmt in (cfg.baseline, *[f for f in cfg.formats if f not in ("bf16", "fp32")]):
        rows = []
        for seed in range(cfg.seed, cfg.seed + cfg.seeds):
            try:
                row = train_one(fmt, cfg, train_data, val_data, seed)
            except Exception as e:  # one failing format must not hide the others
                traceback.print_exc()
                row = {"format": fmt, "losses": [], "seed": seed, "error": f"{type(e).__name__}: {e}"[:500]}
            rows.append(row)
            if on_result:
                on_result(row)
            if row["error"]:
                break
        runs.append(rows[0] if cfg.seeds == 1 else _over_seeds(rows))
    base = runs[0].get("final_loss")
    for r in runs:
        if r.get("final_loss") is not None and base:
            r["gap_pct"] = 100.0 * (r["final_loss"] - base) / base
    return {"config": {"formats": list(cfg.formats), "size": cfg.size, "steps": cfg.steps, "batch": cfg.batch,
                       "seq_len": SIZES[cfg.size].seq_len, "lr": cfg.lr, "seed": cfg.seed, "seeds": cfg.seeds, "device": cfg.device,
                       "backend": cfg.backend, "baseline": cfg.baseline, "corpus_bytes": int(len(data))},
            "runs": runs}
