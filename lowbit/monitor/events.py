"""Events of one step and the culprit among them.

``read_step(step, rows, aliases, layout, thresholds)`` turns the step's statistics (the buffer
as read back, a float64 array) into per-row figures and ``Event`` s:

* ``"nonfinite"``: the row saw NaN or +-inf (``value``: how many elements);
* ``"overflow"``: a lowbit cast clips more than ``thresholds.overflow`` of the tensor
  (``value``: that fraction; ``stats.saturation_limit``);
* ``"underflow"``: a lowbit cast flushes more than ``thresholds.underflow`` of the non-zero
  elements to zero (``value``: that fraction).

A row noted as an alias (the same tensor was recorded by another row, ``registry``) takes that
row's figures. Non-finite events are ordered forward before backward, then by the clock ticket of
their first non-finite record (each phase has its own buffer and clock; aliases after the row they
copy, deeper modules first on a tie), the others by row.

The culprit of a step is its first non-finite event whose module made the non-finite values from
finite ones: in the forward, a non-finite ``output`` while every input and parameter is finite, or
a non-finite parameter while every input is finite (the NaN enters there); in the backward, a
non-finite ``grad_input`` or parameter gradient while every ``grad_output`` is finite. Modules the
NaN merely flowed through (a non-finite input, or grad_output) are not culprits, and neither is a
parent whose child is (the child's record comes first).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

import numpy as np

from ..dtypes.formats import get_format
from .stats import COL

__all__ = ["Event", "NumericsError", "Thresholds", "StepReport", "read_step"]

_SUM = [COL[c] for c in ("nonfinite", "saturated", "underflow", "nonzero", "numel", "signal", "noise", "calls")]


@dataclass(frozen=True)
class Event:
    """``kind`` ("nonfinite", "overflow", "underflow"), ``step`` (the number of ``mon.step()`` calls
    before it), ``module`` (qualified name, "" for the root), ``phase`` ("forward", "backward"),
    ``tensor`` ("input", "output", "grad_output", "grad_input", or a parameter's name such as
    "weight": in the backward, its gradient), ``value`` (count or fraction)."""

    kind: str
    step: int
    module: str
    phase: str
    tensor: str
    value: float

    def __str__(self) -> str:
        what = f"{int(self.value)} non-finite" if self.kind == "nonfinite" else f"{self.value:.3g} {self.kind}"
        return f"step {self.step}: {what} in {self.module or '<root>'} {self.phase} {self.tensor}"

    def as_dict(self) -> dict:
        return {"kind": self.kind, "step": self.step, "module": self.module, "phase": self.phase,
                "tensor": self.tensor, "value": self.value}


class NumericsError(RuntimeError):
    """Raised by ``on_anomaly="raise"``; ``.event`` is the ``Event``."""

    def __init__(self, event: Event):
        super().__init__(str(event))
        self.event = event


@dataclass(frozen=True)
class Thresholds:
    """Fractions above which a cast's saturation or flush-to-zero is an event."""

    overflow: float = 1e-3
    underflow: float = 1e-2


@dataclass
class StepReport:
    step: int
    figures: np.ndarray  # (rows, WIDTH) with aliases resolved
    events: List[Event]
    culprit: Optional[Event]


def _resolve(rows: np.ndarray, aliases: Dict[int, Set[int]]) -> Tuple[np.ndarray, np.ndarray]:
    """Rows with the figures of the rows they alias added; and which rows hold aliases only."""
    out = rows.copy()
    alias_only = np.zeros(len(rows), dtype=bool)
    for slot, srcs in aliases.items():
        if slot >= len(rows):
            continue
        alias_only[slot] = rows[slot, COL["calls"]] == 0
        for s in srcs:
            out[slot, _SUM] += rows[s, _SUM]
            out[slot, COL["amax"]] = max(out[slot, COL["amax"]], rows[s, COL["amax"]])
            out[slot, COL["seq"]] = min(out[slot, COL["seq"]], rows[s, COL["seq"]])
    return out, alias_only


def read_step(step: int, buf: np.ndarray, aliases: Dict[int, Set[int]], layout, thresholds: Thresholds) -> StepReport:
    """``buf``: (2, rows + 1, WIDTH), the forward and the backward buffer as read back."""
    rows, alias_only = _resolve(np.where(layout.backward[:, None], buf[1, :-1], buf[0, :-1]), aliases)
    sites = layout.sites
    nf = rows[:, COL["nonfinite"]]
    bad = np.nonzero(nf > 0)[0]
    order = sorted(bad, key=lambda i: (layout.backward[i], rows[i, COL["seq"]], alias_only[i],
                                       -sites[i].module.count("."), i))
    events = [Event("nonfinite", step, sites[i].module, sites[i].phase, sites[i].tensor, float(nf[i])) for i in order]
    numel, nonzero = rows[:, COL["numel"]], rows[:, COL["nonzero"]]
    for i in np.nonzero(rows[:, COL["calls"]] > 0)[0]:
        if not sites[i].recipe:
            continue
        sat = rows[i, COL["saturated"]] / numel[i] if numel[i] else 0.0
        if sat > thresholds.overflow:
            events.append(Event("overflow", step, sites[i].module, sites[i].phase, sites[i].tensor, float(sat)))
        uf = rows[i, COL["underflow"]] / nonzero[i] if nonzero[i] else 0.0
        if uf > thresholds.underflow:
            events.append(Event("underflow", step, sites[i].module, sites[i].phase, sites[i].tensor, float(uf)))
    culprit = next((e for e in events if e.kind == "nonfinite" and _made_here(e, rows, layout)), None)
    return StepReport(step, rows, events, culprit)


def _made_here(e: Event, rows: np.ndarray, layout) -> bool:
    nf = rows[:, COL["nonfinite"]]
    mine = [layout.sites[i] for i in layout.modules[e.module]]

    def finite(phase, tensors=None, params=False) -> bool:
        for s in mine:
            is_param = s.tensor not in ("input", "output", "grad_output", "grad_input")
            if s.phase == phase and ((tensors and s.tensor in tensors) or (params and is_param)):
                if nf[layout.slot(s.module, s.phase, s.tensor)] > 0:
                    return False
        return True

    if e.phase == "forward":
        if e.tensor == "input":
            return False
        if e.tensor == "output":
            return finite("forward", ("input",), params=True)
        return finite("forward", ("input",))
    if e.tensor == "grad_output":
        return False
    return finite("backward", ("grad_output",))


def figures(site, row: np.ndarray) -> dict:
    """The JSON figures of one row (fractions, the cast's scale and SQNR in dB)."""
    out = {"nonfinite": int(row[COL["nonfinite"]]), "amax": float(row[COL["amax"]]), "numel": int(row[COL["numel"]])}
    if site.recipe:
        numel, nz = row[COL["numel"]], row[COL["nonzero"]]
        out["saturated"] = float(row[COL["saturated"]] / numel) if numel else 0.0
        out["underflow"] = float(row[COL["underflow"]] / nz) if nz else 0.0
        out["scale"] = float(row[COL["scale"]])
        out["fmt"] = site.fmt
        if site.delayed and row[COL["scale"]] > 0:  # > 1: the stale scale missed the amax by this factor
            out["amax_ratio"] = float(row[COL["amax"]] / (row[COL["scale"]] * get_format(site.fmt).max))
        if row[COL["signal"]] > 0:
            noise = row[COL["noise"]]
            out["sqnr_db"] = float(10 * math.log10(row[COL["signal"]] / noise)) if noise > 0 else None
    return out
