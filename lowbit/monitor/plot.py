"""PNG plots of a monitor's JSON lines (``lowbit monitor plot FILE``), with matplotlib.

Top: the amax of every lowbit cast over the steps (log scale, one line per module and tensor)
with its range ``scale * fmax`` dashed in the same colour: where a line rises above its dashed
one, the cast saturates. Bottom: per cast, the worst fraction saturated and flushed to zero over
the run (bars; non-finite steps marked in the title). Casts shown: the ``top`` with the largest
saturated plus flushed fractions, so a big model stays readable.
"""
from __future__ import annotations

import json
from typing import Dict, List, Tuple

from ..dtypes.formats import get_format

__all__ = ["read_lines", "plot"]


def read_lines(path: str) -> List[dict]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _casts(lines: List[dict]) -> Dict[Tuple[str, str, str], List[tuple]]:
    """(module, phase, tensor) -> [(step, figures)] for the rows that hold a cast."""
    out: Dict[Tuple[str, str, str], List[tuple]] = {}
    for line in lines:
        for mod, phases in line["modules"].items():
            for phase, tensors in phases.items():
                for tensor, fig in tensors.items():
                    if "fmt" in fig:
                        out.setdefault((mod, phase, tensor), []).append((line["step"], fig))
    return out


def plot(path: str, out: str, top: int = 12) -> str:
    """Write the PNG of the JSON lines at ``path`` to ``out``; returns ``out``."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("lowbit monitor plot needs matplotlib: pip install matplotlib") from e
    lines = read_lines(path)
    casts = _casts(lines)
    worst = {k: (max(f.get("saturated", 0) for _, f in v), max(f.get("underflow", 0) for _, f in v))
             for k, v in casts.items()}
    keys = sorted(casts, key=lambda k: -sum(worst[k]))[:top]
    bad_steps = sorted({e["step"] for line in lines for e in line["events"] if e["kind"] == "nonfinite"})
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 8), dpi=100)
    for i, k in enumerate(keys):
        steps = [s for s, _ in casts[k]]
        color = f"C{i % 10}"
        label = f"{k[0] or '<root>'} {k[2]}"
        ax1.plot(steps, [max(f["amax"], 1e-45) for _, f in casts[k]], color=color, lw=1.3, label=label)
        fmax = get_format(casts[k][0][1]["fmt"]).max
        ax1.plot(steps, [f["scale"] * fmax for _, f in casts[k]], color=color, lw=0.9, ls="--")
    ax1.set_yscale("log")
    ax1.set_xlabel("step")
    ax1.set_ylabel("amax (solid), scale x fmax (dashed)")
    bad = f"; non-finite at steps {bad_steps[:8]}" if bad_steps else ""
    ax1.set_title("lowbit.monitor: casts' amax and range" + bad)
    if keys:
        ax1.legend(fontsize=7, ncol=2)
    xs = range(len(keys))
    ax2.bar([x - 0.2 for x in xs], [100 * worst[k][0] for k in keys], width=0.4, label="saturated (max over steps)")
    ax2.bar([x + 0.2 for x in xs], [100 * worst[k][1] for k in keys], width=0.4, label="flushed to 0 (max over steps)")
    ax2.set_xticks(list(xs))
    ax2.set_xticklabels([f"{k[0] or '<root>'}\n{k[2]}" for k in keys], rotation=60, ha="right", fontsize=7)
    ax2.set_ylabel("% of the tensor (flushed: of its non-zeros)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out
