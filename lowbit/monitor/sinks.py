"""Where a monitor's steps go: JSON lines, TensorBoard, and the terminal report.

* ``JsonLines(path)``: one JSON object per monitored step,
  ``{"step": s, "modules": {name: {phase: {tensor: figures}}}, "events": [...]}`` with the
  figures of ``events.figures`` (rows that recorded nothing that step are left out); strict JSON
  (no NaN or Infinity: an exact cast's SQNR is ``null``).
* ``TensorBoard(dir)``: ``torch.utils.tensorboard.SummaryWriter`` scalars
  ``{module}/{phase}.{tensor}/{figure}`` (amax and non-finite count of every row, and saturated,
  underflow, scale and SQNR of the casts) and the events as text. Needs the ``tensorboard``
  package: a clear ImportError when the monitor is made otherwise.
* ``report(totals, layout)``: the terminal table, one line per tensor that had an event or is a
  lowbit cast: steps with non-finite values (and the first), the largest amax, the worst
  saturated and flushed fractions, the lowest SQNR, the last scale.
"""
from __future__ import annotations

import json
import math
from typing import List

import numpy as np

from .events import StepReport, figures
from .stats import COL

__all__ = ["JsonLines", "TensorBoard", "make_sinks", "Totals", "report"]


class JsonLines:
    def __init__(self, path: str):
        self.path = path
        self.fh = open(path, "w")

    def write(self, rep: StepReport, layout) -> None:
        mods: dict = {}
        for i, site in enumerate(layout.sites):
            if rep.figures[i, COL["calls"]] == 0:
                continue
            mods.setdefault(site.module, {}).setdefault(site.phase, {})[site.tensor] = figures(site, rep.figures[i])
        line = {"step": rep.step, "modules": mods, "events": [e.as_dict() for e in rep.events],
                "culprit": rep.culprit.as_dict() if rep.culprit else None}
        self.fh.write(json.dumps(line, allow_nan=False) + "\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


class TensorBoard:
    def __init__(self, logdir: str):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError("lowbit.monitor log='tb:DIR' needs TensorBoard: pip install tensorboard") from e
        self.writer = SummaryWriter(logdir)

    def write(self, rep: StepReport, layout) -> None:
        for i, site in enumerate(layout.sites):
            if rep.figures[i, COL["calls"]] == 0:
                continue
            tag = f"{site.module or '<root>'}/{site.phase}.{site.tensor}"
            for k, v in figures(site, rep.figures[i]).items():
                if isinstance(v, (int, float)) and k != "numel" and math.isfinite(v):
                    self.writer.add_scalar(f"{tag}/{k}", v, rep.step)
        for e in rep.events:
            self.writer.add_text("lowbit.monitor/events", str(e), rep.step)

    def close(self) -> None:
        self.writer.close()


def make_sinks(log) -> list:
    """``log``: None, a path (``.jsonl`` lines), ``"tb:DIR"``, or a list of those."""
    if log is None:
        return []
    if not isinstance(log, (str, list, tuple)):
        raise TypeError(f"log= takes a path, 'tb:DIR' or a list of them, got {log!r}")
    items = [log] if isinstance(log, str) else list(log)
    out = []
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"log= takes a path, 'tb:DIR' or a list of them, got {item!r}")
        out.append(TensorBoard(item[3:]) if item.startswith("tb:") else JsonLines(item))
    return out


class Totals:
    """Per-row aggregates over the monitored steps (what ``report`` prints)."""

    def __init__(self, n: int):
        self.steps = 0
        self.nonfinite_steps = np.zeros(n, dtype=np.int64)
        self.first_nonfinite = np.full(n, -1, dtype=np.int64)
        self.amax = np.zeros(n)
        self.saturated = np.zeros(n)
        self.underflow = np.zeros(n)
        self.sqnr = np.full(n, np.inf)
        self.scale = np.zeros(n)
        self.seen = np.zeros(n, dtype=bool)

    def add(self, rep: StepReport) -> None:
        f = rep.figures
        self.steps += 1
        called = f[:, COL["calls"]] > 0
        self.seen |= called
        bad = f[:, COL["nonfinite"]] > 0
        self.nonfinite_steps += bad
        self.first_nonfinite = np.where(bad & (self.first_nonfinite < 0), rep.step, self.first_nonfinite)
        self.amax = np.maximum(self.amax, f[:, COL["amax"]])
        with np.errstate(divide="ignore", invalid="ignore"):
            sat = np.where(f[:, COL["numel"]] > 0, f[:, COL["saturated"]] / f[:, COL["numel"]], 0.0)
            uf = np.where(f[:, COL["nonzero"]] > 0, f[:, COL["underflow"]] / f[:, COL["nonzero"]], 0.0)
            sq = np.where(f[:, COL["signal"]] > 0, 10 * np.log10(f[:, COL["signal"]] / f[:, COL["noise"]]), np.inf)
        self.saturated = np.maximum(self.saturated, sat)
        self.underflow = np.maximum(self.underflow, uf)
        self.sqnr = np.minimum(self.sqnr, sq)
        self.scale = np.where(called & (f[:, COL["scale"]] > 0), f[:, COL["scale"]], self.scale)


def report(totals: Totals, layout, first=None, max_rows: int = 40) -> str:
    cols = ("module", "phase", "tensor", "non-finite steps", "amax max", "saturated max", "flushed max",
            "SQNR min dB", "scale")
    rows: List[tuple] = []
    for i, site in enumerate(layout.sites):
        if not totals.seen[i] or not (site.recipe or totals.nonfinite_steps[i]):
            continue
        nfs = totals.nonfinite_steps[i]
        rows.append((site.module or "<root>", site.phase, site.tensor,
                     f"{nfs} (first {totals.first_nonfinite[i]})" if nfs else "0",
                     f"{totals.amax[i]:.4g}",
                     f"{100 * totals.saturated[i]:.3g}%" if site.recipe else "-",
                     f"{100 * totals.underflow[i]:.3g}%" if site.recipe else "-",
                     f"{totals.sqnr[i]:.1f}" if site.recipe and math.isfinite(totals.sqnr[i]) else "-",
                     f"{totals.scale[i]:.4g}" if site.recipe else "-"))
    rows.sort(key=lambda r: (r[3] == "0", r[0]))
    head = [f"lowbit.monitor: {totals.steps} monitored step(s), {len(layout.sites)} tensors watched"]
    head.append(f"first non-finite: {first}" if first else "no non-finite value made inside the model")
    if not rows:
        return "\n".join(head)
    shown = rows[:max_rows]
    widths = [max(len(c), *(len(r[k]) for r in shown)) for k, c in enumerate(cols)]
    lines = head + ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in shown]
    if len(rows) > max_rows:
        lines.append(f"... {len(rows) - max_rows} more (the JSON lines log has every tensor)")
    return "\n".join(lines)
