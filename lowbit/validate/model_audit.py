"""``lowbit.validate.audit_model``: what each low-precision format costs each Linear layer of a model.

``audit_model(model, batch, formats=DEFAULT_FORMATS) -> ModelAudit``: one forward and backward of a
float64 copy of the model (the reference), then one per format of a deep copy converted by
``lowbit.convert(copy, fmt, filter=every Linear)``. The model is not modified.

Per layer and format: the SQNR (dB, ``metrics.sqnr_db``) against the reference of the layer's
output (``sqnr_db``), of its worst output channel (``sqnr_worst_db``: the lowest per-channel SQNR,
``metrics.sqnr_per_channel_db`` over the last dim; a whole-tensor SQNR hides crushed channels), of
the gradient of its input (``sqnr_grad_input_db``, dgrad) and of its weight
(``sqnr_grad_weight_db``, wgrad); ``overflow`` and ``underflow``: the fraction of the layer's
operands (input, weight, output gradient, as the reference saw them) that the format's casts
saturate (``|x| > fmax * scale``) and, of the nonzero ones, that they flush to zero; per layer the
dynamic range ``log2(amax / amin)`` of the nonzero |input|, |weight|, |output gradient|.

Isolation (``isolate=True``, the default): each converted layer is fed the reference's input (in
the copy's dtype) and, in the backward, the reference's output gradient, so a layer's numbers are
its own cost, not the sum of the layers before it (the autograd graph is kept: the value is
swapped, ``x_ref + (x - x.detach())``). ``isolate=False`` measures the propagated error instead.
Delayed scaling (``fp8``) primes its scales from the first tensors it sees, so one step is current
scaling; the casts behind ``overflow`` / ``underflow`` use current scaling for it.

Loss: ``loss_fn(output)`` if given; else ``output.loss`` when the output has one (Hugging Face);
else ``sum(output * G)`` with a fixed random ``G`` (the first tensor of a tuple output; ``logits``
of an output object), which gives every format the same output gradient.

``recommended`` (per layer, on each of its entries): the coarsest audited format whose output's
worst channel, input gradient and weight gradient all stay at or above ``threshold_db``, else
``"high-precision"``. Default ``THRESHOLD_DB = 15`` (an 18% RMS error): E4M3 rounding gives a clean
Gaussian layer ~28 dB over the whole output and 20-25 dB in its worst channel (the lowest of
out_features noisy estimates), E5M2 gradients ~25 dB; a layer under 15 dB loses much more than
its format's rounding (outliers or a wide dynamic range crush some of its channels), and FP4
formats (~15-19 dB over the tensor) pass only where a layer's channels are uniform. Coarse to fine (``COARSE_TO_FINE``): 4-bit
elements before 8-bit ones; then fewer scales per forward operand first: tensorwise (delayed
before current), rowwise (one scale per row of K), blockwise (1x128 activations and 128x128
weights), MX (one E8M0 scale per 32). Formats not in that list come last, in the order given.

The result ranks layers worst first per format (by ``sqnr_worst_db``); ``to_dict()`` is the JSON of
``lowbit audit model --json``: ``{"layers": [{"name", "format", "sqnr_db", "sqnr_worst_db",
"sqnr_grad_input_db", "sqnr_grad_weight_db", "overflow", "underflow", "recommended"}, ...]}``.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from typing import Callable, Optional

import torch
from torch import nn

from .metrics import sqnr_db, sqnr_per_channel_db

__all__ = ["audit_model", "ModelAudit", "LayerResult", "DEFAULT_FORMATS", "COARSE_TO_FINE", "THRESHOLD_DB"]

COARSE_TO_FINE = ("mxfp4", "nvfp4", "fp8", "fp8-current", "fp8-rowwise", "fp8-block", "mxfp8")
DEFAULT_FORMATS = ("fp8", "fp8-rowwise", "fp8-block", "mxfp8", "mxfp4", "nvfp4")
THRESHOLD_DB = 15.0
KEEP = "high-precision"
_KEYS = ("name", "format", "sqnr_db", "sqnr_worst_db", "sqnr_grad_input_db", "sqnr_grad_weight_db",
         "overflow", "underflow", "recommended")


@dataclasses.dataclass(frozen=True)
class LayerResult:
    name: str
    format: str
    sqnr_db: float
    sqnr_worst_db: float
    sqnr_grad_input_db: float
    sqnr_grad_weight_db: float
    overflow: float
    underflow: float
    recommended: str

    def to_dict(self) -> dict:
        return {k: _json(getattr(self, k)) for k in _KEYS}


@dataclasses.dataclass(frozen=True)
class ModelAudit:
    """``layers``: one entry per (layer, format), per format worst channel first; ``skipped``: the
    (format, layer, why) that a format cannot convert; ``dynamic_range``: layer -> {"input",
    "weight", "grad_output"} in bits."""
    layers: tuple
    formats: tuple
    threshold_db: float
    dynamic_range: dict
    skipped: tuple = ()

    def ranking(self, fmt: str) -> list:
        """Layer names under ``fmt``, worst first."""
        return [r.name for r in self.layers if r.format == fmt]

    @property
    def recommended(self) -> dict:
        return {r.name: r.recommended for r in self.layers}

    def to_dict(self) -> dict:
        return {"layers": [r.to_dict() for r in self.layers]}

    def format(self) -> str:
        cols = ("layer", "out dB", "worst ch dB", "dgrad dB", "wgrad dB", "overflow", "underflow",
                "range in/w/g", "recommended")
        out = []
        for fmt in self.formats:
            rows = [(r.name, _db(r.sqnr_db), _db(r.sqnr_worst_db), _db(r.sqnr_grad_input_db),
                     _db(r.sqnr_grad_weight_db), f"{r.overflow:.2%}", f"{r.underflow:.2%}",
                     "/".join(f"{v:.0f}" for v in self.dynamic_range.get(r.name, {}).values()), r.recommended)
                    for r in self.layers if r.format == fmt]
            out.append(f"{fmt} (worst first; threshold {self.threshold_db:g} dB)")
            if not rows:
                out.append("  no layer converted")
                continue
            widths = [max(len(c), *(len(x[i]) for x in rows)) for i, c in enumerate(cols)]
            out.append("  " + "  ".join(c.ljust(w) for c, w in zip(cols, widths)))
            out += ["  " + "  ".join(v.ljust(w) for v, w in zip(x, widths)) for x in rows]
        out += [f"skipped under {f}: {n} ({why})" for f, n, why in self.skipped]
        return "\n".join(out)


def _db(v: float) -> str:
    return f"{v:.1f}" if math.isfinite(v) else ("inf" if v > 0 else "-inf")


def _json(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "inf" if v > 0 else ("-inf" if v < 0 else "nan")
    return v


# ---- capture ------------------------------------------------------------------------------------------
def _layers(model: nn.Module) -> dict:
    from ..nn.linear import is_hf_conv1d
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) or is_hf_conv1d(m)}


class _Tap:
    """Hooks on one layer: its inputs, outputs and output gradients per call; in ``replay`` mode the
    reference's input and output gradient replace the values (graph kept)."""

    def __init__(self, module: nn.Module, ref: Optional["_Tap"] = None):
        self.x, self.y, self.gy, self.gx = [], [], [], []
        self.ref = ref
        self.handles = [module.register_forward_pre_hook(self._pre), module.register_forward_hook(self._post),
                        module.register_full_backward_pre_hook(self._bpre),
                        module.register_full_backward_hook(self._bpost)]
        self._bcalls = 0

    def _pre(self, module, args):
        x = args[0]
        if self.ref is not None:
            xr = self.ref.x[len(self.x)].to(device=x.device, dtype=x.dtype)
            x = xr + (x - x.detach()) if x.requires_grad else xr.requires_grad_(True)
        elif not x.requires_grad:
            x = x.detach().requires_grad_(True)
        self.x.append(x.detach())
        return (x,) + tuple(args[1:])

    def _post(self, module, args, out):
        self.y.append(out.detach())

    def _bpre(self, module, grad_out):
        i = len(self.y) - 1 - self._bcalls  # backward runs the calls in reverse
        self._bcalls += 1
        g = grad_out[0]
        if self.ref is not None and g is not None:
            g = self.ref.gy[i].to(device=g.device, dtype=g.dtype)
        self.gy.insert(0, g.detach() if g is not None else None)
        return (g,) + tuple(grad_out[1:])

    def _bpost(self, module, grad_in, grad_out):
        self.gx.insert(0, grad_in[0].detach() if grad_in[0] is not None else None)

    def remove(self):
        for h in self.handles:
            h.remove()


def _cat(ts) -> Optional[torch.Tensor]:
    ts = [t for t in ts if t is not None]
    if not ts:
        return None
    return torch.cat([t.reshape(-1, t.shape[-1]).to(torch.float64) for t in ts], 0)


def _loss(out, loss_fn, gen_seed: int):
    if loss_fn is not None:
        return loss_fn(out)
    if getattr(out, "loss", None) is not None:
        return out.loss
    t = getattr(out, "logits", None)
    if t is None:
        t = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"audit_model: cannot make a loss from a {type(out).__name__} output; pass loss_fn")
    g = torch.randn(t.shape, generator=torch.Generator().manual_seed(gen_seed), dtype=torch.float64)
    return (t * g.to(device=t.device, dtype=t.dtype)).sum()


def _to(batch, dtype):
    """Floating tensors of a batch (tensor, tuple/list, dict) in ``dtype``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {k: _to(v, dtype) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to(v, dtype) for v in batch)
    return batch


def _call(model, batch):
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _float_dtype(model: nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def _run(model, batch, names, refs, loss_fn, seed):
    """One forward + backward with taps on ``names``; (taps, weight grads)."""
    mods = dict(model.named_modules())
    taps = {n: _Tap(mods[n], refs[n] if refs else None) for n in names}
    try:
        model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            _loss(_call(model, batch), loss_fn, seed).backward()
    finally:
        for t in taps.values():
            t.remove()
    wgrads = {n: (mods[n].weight.grad.detach() if mods[n].weight.grad is not None else None) for n in names}
    return taps, wgrads


# ---- statistics ---------------------------------------------------------------------------------------
def _log2_range(t: Optional[torch.Tensor]) -> float:
    if t is None:
        return math.nan
    a = t.abs().to(torch.float64)
    a = a[torch.isfinite(a) & (a > 0)]
    return float(torch.log2(a.max() / a.min())) if a.numel() else 0.0


def _saturation(x: torch.Tensor, recipe, role: str) -> tuple:
    """(saturated elements, flushed nonzero elements, elements) of ``x`` under ``recipe``'s cast."""
    from ..dtypes import FP4Tensor, FP8Tensor
    from ..scaling import Current, Delayed, expand_scale
    if isinstance(recipe, Delayed):  # one step of delayed scaling is current scaling (primed)
        recipe = Current(input_format=recipe.input_format, weight_format=recipe.weight_format,
                         grad_format=recipe.grad_format)
    x2 = x.reshape(-1, x.shape[-1]).to(torch.float32)
    fmt = recipe.format(role)
    if recipe.kind == "fp4":
        q = FP4Tensor.from_float(x2, recipe, role, stochastic=False)
        s = expand_scale(q.block_scale_fp32(), tuple(x2.shape), q.block) * q._global_scale
    else:
        q = FP8Tensor.from_float(x2, recipe, role)
        s = expand_scale(q.scale_fp32(), tuple(x2.shape), q.block)
    deq = q.dequantize(torch.float32)
    a = x2.abs()
    fin = torch.isfinite(a)
    over = int((fin & (a > fmt.max * s)).sum())
    under = int((fin & (a > 0) & (deq == 0)).sum())
    return over, under, int(fin.sum())


def _shape_problem(recipe, mod) -> Optional[str]:
    from ..nn.linear import is_hf_conv1d
    from ..nn.spec import shape_problem
    k, n = tuple(mod.weight.shape) if is_hf_conv1d(mod) else (mod.in_features, mod.out_features)
    return shape_problem(recipe, k, n)


# ---- the audit --------------------------------------------------------------------------------------------
def audit_model(model: nn.Module, batch, formats=DEFAULT_FORMATS, *, threshold_db: float = THRESHOLD_DB,
                loss_fn: Optional[Callable] = None, isolate: bool = True, progress=None,
                seed: int = 0) -> ModelAudit:
    """Audit every Linear layer of ``model`` on ``batch`` under each of ``formats`` (module docstring).
    ``batch``: a tensor, a tuple (positional args) or a dict (keyword args) for ``model``;
    ``progress(i, n, what)`` is called as the audit goes."""
    from ..convert import FORMATS, convert, recipe_for
    from ..nn.linear import LowbitModule
    formats = tuple(formats)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"audit_model: unknown format(s) {unknown}; choose from {sorted(FORMATS)}")
    names = list(_layers(model))
    if not names:
        raise ValueError(f"audit_model: {type(model).__name__} has no Linear layers")
    steps = 2 + len(formats)
    tick = progress or (lambda i, n, what: None)
    tick(0, steps, "float64 reference")
    ref = copy.deepcopy(model).to(torch.float64)
    ref_taps, ref_wg = _run(ref, _to(batch, torch.float64), names, None, loss_fn, seed)
    ref_x = {n: _cat(ref_taps[n].x) for n in names}
    ref_y = {n: _cat(ref_taps[n].y) for n in names}
    ref_gy = {n: _cat(ref_taps[n].gy) for n in names}
    ref_gx = {n: _cat(ref_taps[n].gx) for n in names}
    mods = dict(model.named_modules())
    dyn = {n: {"input": _log2_range(ref_x[n]), "weight": _log2_range(mods[n].weight.detach()),
               "grad_output": _log2_range(ref_gy[n])} for n in names}
    dtype = _float_dtype(model)
    entries, skipped = [], []
    for i, fmt in enumerate(formats):
        tick(1 + i, steps, fmt)
        recipe = recipe_for(fmt)
        work = copy.deepcopy(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # layers a format can't take: recorded below
            work = convert(work, fmt, filter=lambda name, mod: True)
        wmods = dict(work.named_modules())
        live = [n for n in names if isinstance(wmods.get(n), LowbitModule)]
        skipped += [(fmt, n, _shape_problem(recipe, mods[n]) or "not converted") for n in names if n not in live]
        taps, wg = _run(work, _to(batch, dtype), names, ref_taps if isolate else None, loss_fn, seed)
        for n in live:
            y = _cat(taps[n].y)
            over = under = total = 0
            for t, role in ((ref_x[n], "input"), (mods[n].weight.detach(), "weight"), (ref_gy[n], "grad")):
                if t is not None:
                    o, u, c = _saturation(t.to(dtype), recipe, role)
                    over, under, total = over + o, under + u, total + c
            entries.append(dict(
                name=n, format=fmt, sqnr_db=sqnr_db(ref_y[n], y),
                sqnr_worst_db=float(sqnr_per_channel_db(ref_y[n], y).min()),
                sqnr_grad_input_db=sqnr_db(ref_gx[n], _cat(taps[n].gx)) if ref_gx[n] is not None else math.nan,
                sqnr_grad_weight_db=sqnr_db(ref_wg[n], wg[n]) if ref_wg[n] is not None else math.nan,
                overflow=over / total if total else 0.0, underflow=under / total if total else 0.0))
        del work, taps
    tick(steps - 1, steps, "ranking")
    rec = _recommend(entries, formats, threshold_db)
    order = {f: i for i, f in enumerate(formats)}
    entries.sort(key=lambda e: (order[e["format"]], e["sqnr_worst_db"]))
    layers = tuple(LayerResult(recommended=rec[e["name"]], **e) for e in entries)
    tick(steps, steps, "done")
    return ModelAudit(layers, formats, threshold_db, dyn, tuple(skipped))


def _recommend(entries: list, formats: tuple, threshold_db: float) -> dict:
    """Per layer: the coarsest format (COARSE_TO_FINE, then the rest) whose three SQNRs all reach
    the threshold; ``KEEP`` when none does."""
    order = [f for f in COARSE_TO_FINE if f in formats] + [f for f in formats if f not in COARSE_TO_FINE]
    worst = {}
    for e in entries:
        vals = [e["sqnr_worst_db"], e["sqnr_grad_input_db"], e["sqnr_grad_weight_db"]]
        worst[(e["name"], e["format"])] = min(v for v in vals if not math.isnan(v)) if any(
            not math.isnan(v) for v in vals) else -math.inf
    out = {}
    for name in {e["name"] for e in entries}:
        out[name] = next((f for f in order if worst.get((name, f), -math.inf) >= threshold_db), KEEP)
    return out
