"""The statistics buffer and the one op that writes it: ``torch.ops.lowbit_monitor.record``.

Layout: a float64 tensor ``(slots + 1, WIDTH)`` on the model's device (a monitor has two: the
forward's and the backward's), one row ("slot") per (module, phase, tensor), the last row holding
the clock. Columns (``COL``):

=========  ==============================================================  ==========
column     value over the step                                             combine
=========  ==============================================================  ==========
nonfinite  elements that are NaN or +-inf                                  sum
amax       max |x| over the finite elements (0 when none)                  max
saturated  elements a lowbit cast clips: ``|x / scale|`` above             sum
           ``saturation_limit(fmt)``, where round-to-nearest-even would
           leave the format's range (+-inf included; NaN is not)
underflow  non-zero elements the cast flushes to zero: ``x != 0`` and      sum
           ``|x / scale| <= min_subnormal / 2`` (round-to-nearest-even)
nonzero    elements ``!= 0`` (the underflow fraction's denominator)         sum
numel      elements recorded                                                sum
seq        clock ticket of the first record that saw a non-finite value    min (+inf: none)
scale      the cast's tensorwise scale (block recipes: the largest)         last
signal     ``sum x^2`` over finite x (SQNR steps only)                      sum
noise      ``sum (x - dequant(quant(x)))^2`` over the same elements        sum
calls      records made                                                    sum
=========  ==============================================================  ==========

``x / scale`` is the IEEE fp32 quotient of ``fp32(x)`` and the fp32 scale, as in
``lowbit.dtypes.quantize``. The clock orders non-finite records: a record that sees a non-finite
value takes a ticket (the clock, then the clock + 1) and keeps the smallest one; records on one
stream run in program order, so a smaller ticket means an earlier record. Everything is device
tensor arithmetic: no host sync (see ``record``).

``record`` is a ``torch.library`` op that mutates the buffer, so torch.compile keeps it,
keeps the records in program order (they all write one tensor) and captures it in CUDA graphs;
its implementation runs at call time even inside a compiled graph, which is where the per-step
switches live (``Monitor.every``, SQNR steps) and where, in eager mode, a tensor recorded a
moment ago is recognised and not read again (``Session.seen``). On CUDA the reduction is one
Triton kernel per tensor (``stats_kernel``; a block-scaled cast passes its block scales,
``block_scale``; SQNR steps take the same pass with the cast's error added); elsewhere and for
float64, torch ops.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..dtypes.quantize import dequantize, quantize
from ..scaling.blocks import TENSOR, expand_scale
from ..scaling.delayed import DelayedScalingState
from .columns import COL, COLUMNS, WIDTH, saturation_limit
from ..scaling.recipes import NV, Delayed
from .registry import SESSIONS

__all__ = ["COL", "COLUMNS", "WIDTH", "new_buffer", "reset_template", "record", "record_impl", "block_scale", "cast_scale",
           "reduce_into", "saturation_limit"]

_SUMS = [COL[c] for c in ("nonfinite", "saturated", "underflow", "nonzero", "numel", "signal", "noise", "calls")]
STAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def reset_template(n_slots: int, device) -> torch.Tensor:
    """The buffer's value at the start of a step: zeros, ``seq`` = +inf, clock 0."""
    t = torch.zeros(n_slots + 1, WIDTH, dtype=torch.float64, device=device)
    t[:, COL["seq"]] = float("inf")
    t[-1] = 0.0
    return t


def new_buffer(n_slots: int, device) -> torch.Tensor:
    buf = reset_template(n_slots, device)
    if buf.device.type == "cuda":  # a static address: CUDA graphs write into it in place
        import torch._dynamo
        torch._dynamo.mark_static_address(buf)
    return buf


def block_scale(x2d: torch.Tensor, recipe, role: str, scale: Optional[torch.Tensor], prime: bool):
    """(scales, block, format) of the cast lowbit makes of ``x2d`` for ``role``: under delayed
    scaling the state's ``scale`` (or, on a cold start, the scale ``prime`` would set) and
    ``TENSOR``, else the recipe's own fp32 block scales (``recipe.scales``; NV's block scale times
    its tensor scale) of ``block.scale_shape(x2d.shape)``."""
    fmt = recipe.format(role)
    if isinstance(recipe, Delayed):
        if prime or scale is None:
            st = DelayedScalingState.over(recipe, fmt, torch.zeros(1, device=x2d.device),
                                          (scale if scale is not None else torch.ones((), device=x2d.device))
                                          .detach().to(torch.float32).clone())
            st.prime(x2d)
            scale = st.scale
        return (scale if scale.dtype == torch.float32 else scale.to(torch.float32)), TENSOR, fmt
    block = recipe.granularity(role)
    if isinstance(recipe, NV):
        s_block, s_global = recipe.scales(x2d, role)
        return s_block * s_global, block, fmt
    return recipe.scales(x2d, role), block, fmt


def cast_scale(x2d: torch.Tensor, recipe, role: str, scale: Optional[torch.Tensor], prime: bool):
    """(element scale broadcastable to ``x2d``, format): ``block_scale`` expanded to the elements."""
    scales, block, fmt = block_scale(x2d, recipe, role, scale, prime)
    return (scales if block.is_tensorwise else expand_scale(scales, x2d.shape, block)), fmt


def _reference(x: torch.Tensor, scale, fmt, sqnr: bool) -> torch.Tensor:
    """The WIDTH-vector of one record by torch ops (seq and calls left to the caller)."""
    a = x.detach()
    a = a.to(torch.float64 if a.dtype == torch.float64 else torch.float32)
    fin = torch.isfinite(a)
    absx = torch.where(fin, a.abs(), torch.zeros_like(a))
    v = torch.zeros(WIDTH, dtype=torch.float64, device=x.device)
    v[COL["nonfinite"]] = (~fin).sum()
    if a.numel():
        v[COL["amax"]] = absx.amax()
    v[COL["numel"]] = a.numel()
    if scale is not None:
        y = (a.to(torch.float32) / scale).abs()
        nz = a != 0
        v[COL["saturated"]] = (y > saturation_limit(fmt)).sum()
        v[COL["underflow"]] = (nz & (y <= fmt.min_subnormal / 2)).sum()
        v[COL["nonzero"]] = nz.sum()
        v[COL["scale"]] = scale.amax() if scale.numel() else 1.0
        if sqnr:
            x32 = a.to(torch.float32)
            dq = dequantize(quantize(x32, fmt, scale), fmt, scale)
            ok = fin & torch.isfinite(dq)
            v[COL["signal"]] = torch.where(ok, x32.double() ** 2, 0.0).sum()
            v[COL["noise"]] = torch.where(ok, (x32.double() - dq.double()) ** 2, 0.0).sum()
    return v


def reduce_into(stats: torch.Tensor, slot: int, x: torch.Tensor, scale=None, fmt=None, sqnr: bool = False,
                kernel: bool = True, when: int = -1, block=TENSOR, plans=None) -> None:
    """Add the statistics of ``x`` (and of its cast with ``scale`` in ``fmt``: one scale, or one
    per ``block`` of the 2-D ``x``, ``block_scale``; with ``sqnr``, its signal and noise) to row
    ``slot``; with ``when >= 0``, only if row ``when`` has counted a non-finite element (decided on
    the device: the kernel then reads nothing; block-scaled casts are always recorded).
    ``plans``: the kernel launches of the caller's monitor (``registry.Session.plans``)."""
    if kernel and x.device.type == "cuda" and x.dtype != torch.float64:
        from .stats_kernel import launch, launch_blocks
        if scale is None or block.is_tensorwise:
            if (scale is None or scale.numel() == 1) and launch(stats, slot, x, scale, fmt, when, sqnr, plans):
                return
        elif when < 0 and launch_blocks(stats, slot, x, scale, block, fmt, sqnr, plans):
            return
    x = x.detach()
    if scale is not None and not block.is_tensorwise:
        scale = expand_scale(scale, x.shape, block)
    v = _reference(x, scale, fmt, sqnr).to(stats.device)
    v[COL["calls"]] = 1.0
    if when >= 0:
        v = v * (stats[when, COL["nonfinite"]] > 0)
    row, clock = stats[slot], stats[-1, 0:1]
    bad = (v[COL["nonfinite"]] > 0).reshape(1)
    row[COL["seq"]:COL["seq"] + 1] = torch.where(bad, torch.minimum(row[COL["seq"]:COL["seq"] + 1], clock),
                                                row[COL["seq"]:COL["seq"] + 1])
    clock += bad.to(clock.dtype)
    row[_SUMS] += v[_SUMS]
    row[COL["amax"]] = torch.maximum(row[COL["amax"]], v[COL["amax"]])
    if scale is not None:
        row[COL["scale"]] = torch.where(v[COL["calls"]] > 0, v[COL["scale"]], row[COL["scale"]])


def record_impl(stats: torch.Tensor, x: torch.Tensor, session: int, slot: int, scale: Optional[torch.Tensor],
                recipe: str, role: str, prime: bool, dedupe: bool, when: int) -> None:
    """Add ``x``'s statistics to ``stats[slot]`` for monitor ``session`` (if ``when >= 0``: only
    when row ``when`` holds a non-finite count, see ``reduce_into``); ``recipe`` (a
    ``lowbit.nn.spec.encode`` string, "" for none), ``role`` and ``scale`` (the delayed state's
    buffer, or None) describe the lowbit cast ``x`` is about to go through; ``prime``: that cast
    is a delayed-scaling cold start; ``dedupe``: a tensor just recorded may be skipped (eager
    only: inductor reuses the memory of tensors it has freed, so inside a compiled graph the same
    address is no proof of the same tensor)."""
    sess = SESSIONS.get(session)
    if sess is None or not sess.active or x.numel() == 0 or x.dtype not in STAT_DTYPES:
        return
    if x.requires_grad:  # (eager: nothing here joins or keeps the autograd graph; in an op nothing requires grad)
        x = x.detach()
    if dedupe and not recipe and sess.seen(x, slot):
        return
    cast = fmt = None
    block = TENSOR
    if recipe:
        x2d = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)
        try:
            cast, block, fmt = block_scale(x2d, sess.recipe(recipe), role, scale, prime)
            x = x2d
        except Exception as e:  # a tensor the recipe's scale math can't take: its plain figures only
            sess.warn_once(("cast", slot), f"no cast statistics for row {slot} ({role}): {type(e).__name__}: {e}")
    kernel = sess.kernel
    if x.device != stats.device:  # a model moved after attaching, or one without parameters
        sess.warn_device(x.device)
        kernel = False
    reduce_into(stats, slot, x, cast, fmt, sess.sqnr_due and bool(recipe), kernel, when, block, sess.plans)
    if dedupe and when < 0:  # (a conditional record may have read nothing: no alias to it)
        sess.remember(x, slot)


# The op, by torch.library's low-level API: ``torch.library.custom_op`` wraps every call in Python
# layers (autograd and mutation bookkeeping) that cost tens of microseconds of host time a record
# inside a compiled graph; a record has no gradient, and the schema's alias annotation ``(a!)``
# declares what it mutates, for functionalization and CUDA graphs alike.
_LIB = torch.library.Library("lowbit_monitor", "DEF")
_LIB.define("record(Tensor(a!) stats, Tensor x, int session, int slot, Tensor? scale, str recipe, str role, "
            "bool prime, bool dedupe, int when) -> ()")
_LIB.impl("record", record_impl, "CompositeExplicitAutograd")


@torch.library.register_fake("lowbit_monitor::record", lib=_LIB)
def _record_fake(stats, x, session, slot, scale, recipe, role, prime, dedupe, when) -> None:
    return None


record = torch.ops.lowbit_monitor.record
