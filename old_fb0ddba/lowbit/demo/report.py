"""Demo report: the comparison table and a PNG of the loss curves.

``table(result)`` -> text (format, final loss, gap to the baseline in %, held-out loss, tokens/s,
peak memory). Over several seeds: the mean final loss +- the seeds' sample standard deviation, and
the gap +- its standard error from the paired per-seed differences ``d_s = final_s - base_s`` (seed
``s`` gives both runs the same initial weights and batches): ``100 std(d) / sqrt(n) / mean_base``. ``plot(result, path)`` writes the PNG with matplotlib when it is installed;
otherwise with a small built-in rasterizer (``zlib`` + the PNG chunk format: axes, one coloured
polyline per run of its moving-average loss, a colour key in the legend strip, no text).
Returns which writer was used.
"""
from __future__ import annotations

import struct
import zlib
from typing import List

__all__ = ["table", "plot", "smooth", "paired_se_pct"]

COLORS = [(0, 0, 0), (31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14),
          (140, 86, 75), (227, 119, 194)]


def smooth(xs: List[float], k: int = 0) -> List[float]:
    """Trailing moving average over ``k`` steps (``k=0``: 2% of the run, at least 1)."""
    k = k or max(1, len(xs) // 50)
    out, acc = [], 0.0
    for i, v in enumerate(xs):
        acc += v
        if i >= k:
            acc -= xs[i - k]
        out.append(acc / min(i + 1, k))
    return out


def paired_se_pct(run: dict, base: dict):
    """Standard error (in % of the baseline) of the mean per-seed gap; None under two seeds."""
    a, b = run.get("final_losses"), base.get("final_losses")
    if not a or not b or len(a) != len(b) or len(a) < 2:
        return None
    d = [x - y for x, y in zip(a, b)]
    m = sum(d) / len(d)
    sd = (sum((x - m) ** 2 for x in d) / (len(d) - 1)) ** 0.5
    return 100 * sd / len(d) ** 0.5 / base["final_loss"]


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table(result: dict) -> str:
    runs = result["runs"]
    base = result["config"].get("baseline", "bf16")
    cols = ("format", "final loss", f"gap vs {base}", "val loss", "tokens/s", "peak MiB", "note")
    rows = []
    b = runs[0]
    for r in runs:
        if r.get("error"):
            rows.append((r["format"], "-", "-", "-", "-", "-", r["error"][:60]))
            continue
        gap, final = r.get("gap_pct"), _fmt(r["final_loss"], ".4f")
        gap_s = "-" if r["format"] == base else _fmt(gap, "+.2f") + "%"
        if r.get("final_std") is not None:
            final += f" +-{r['final_std']:.4f}"
            se = paired_se_pct(r, b)
            if r["format"] != base and se is not None and gap is not None:
                gap_s += f" +-{se:.2f}"
        rows.append((r["format"], final, gap_s,
                     _fmt(r["val_loss"], ".4f"), _fmt(r["tokens_per_s"], ",.0f"), _fmt(r.get("peak_mem_mb"), ",.0f"),
                     f"{r['converted_layers']} layers converted" if r["format"] != base else "baseline"))
    widths = [max(len(c), *(len(x[i]) for x in rows)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(x, widths)) for x in rows]
    c = result["config"]
    seeds = f"; mean of {c['seeds']} seeds" if c.get("seeds", 1) > 1 else ""
    lines.append(f"({c['size']} GPT, {c['steps']} steps x {c['batch']}x{c['seq_len']} tokens on {c['device']}; "
                 f"final loss = mean training loss over the last 10% of steps{seeds})")
    return "\n".join(lines)


def plot(result: dict, path: str) -> str:
    """Write the loss curves to ``path`` (PNG); returns "matplotlib" or "builtin"."""
    runs = [r for r in result["runs"] if r.get("losses")]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _png_curves(runs, path)
        return "builtin"
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for i, r in enumerate(runs):
        c = tuple(v / 255 for v in COLORS[i % len(COLORS)])
        label = r["format"] + (f" ({r['gap_pct']:+.2f}%)" if r.get("gap_pct") is not None and i else "")
        ax.plot(smooth(r["losses"]), color=c, lw=1.4, label=label)
    cfg = result["config"]
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (moving average)")
    ax.set_title(f"lowbit demo: byte-level GPT ({cfg['size']}) on Python stdlib sources, {cfg['device']}")
    lo = min(min(smooth(r["losses"])) for r in runs)
    hi = max(smooth(r["losses"])[len(r["losses"]) // 10] for r in runs)
    ax.set_ylim(lo - 0.05 * (hi - lo), hi)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return "matplotlib"


# ---- the fallback rasterizer -------------------------------------------------------------------
def _png_curves(runs, path, w=800, h=500, pad=40):
    img = [[(255, 255, 255)] * w for _ in range(h)]
    curves = [smooth(r["losses"]) for r in runs]
    n = max(len(c) for c in curves)
    lo = min(min(c) for c in curves)
    hi = max(c[len(c) // 10] for c in curves)
    hi = hi if hi > lo else lo + 1.0

    def put(x, y, col):
        if 0 <= x < w and 0 <= y < h:
            img[y][x] = col

    def line(x0, y0, x1, y1, col):
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            put(x0, y0, col)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err, x0 = err + dy, x0 + sx
            if e2 <= dx:
                err, y0 = err + dx, y0 + sy

    line(pad, h - pad, w - pad, h - pad, (0, 0, 0))
    line(pad, pad, pad, h - pad, (0, 0, 0))
    for i, c in enumerate(curves):
        col = COLORS[i % len(COLORS)]
        pts = [(pad + int((w - 2 * pad) * j / max(1, n - 1)),
                h - pad - int((h - 2 * pad) * (min(max(v, lo), hi) - lo) / (hi - lo))) for j, v in enumerate(c)]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            line(x0, y0, x1, y1, col)
        for dx in range(20):  # colour key, top right, one bar per run in table order
            for dy in range(4):
                put(w - pad - 20 + dx, pad + 8 * i + dy, col)
    raw = b"".join(b"\x00" + bytes(v for px in row for v in px) for row in img)

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    with open(path, "wb") as fh:
        fh.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                 + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
