"""The hooks a monitor puts on a model, from outside: which modules, which rows, what each records.

Watched: every module of ``model.named_modules()`` (containers too: a NaN made by a parent's own
code, e.g. a residual add or attention's softmax, is then its parent's), except the recipe state
inside lowbit layers. Rows ("sites", one ``Site`` each), fixed when attaching:

* forward ``input`` (every floating tensor in the args and kwargs, one row) and ``output``;
* backward ``grad_output`` (gradients of the outputs) and ``grad_input`` (the gradients this module
  sends to its inputs: its own contribution, not the sum autograd makes over all consumers);
* each parameter by its own name (``weight``, ``bias``, ...): its value in the forward and, if it
  requires grad, its gradient in the backward (a post-accumulate-grad hook: the ``.grad`` after
  accumulation, attributed to the first module that owns the parameter).

Forward inputs and parameters are read only in a step where the module's output is non-finite (the
culprit test needs them then; otherwise they are mostly other modules' outputs, or parameters, and
reading them would double the forward's reads): the forward hook records them after the output,
and the record op skips them on the device unless the output row counted a non-finite element
(``stats.reduce_into(when=)``; a module that changes its input in place is judged on the changed
values). A lowbit layer's input and weight are always read: their rows also hold the statistics of
the cast the layer is about to make: the forward pre-hook runs before the layer's op, so it sees
the delayed-scaling ``scale`` buffer before the op updates it (the gradient's scale is read when
the gradient arrives, before the layer's backward); non-delayed recipes use their own block scales
(``stats.cast_scale``). Tensors: ``torch.Tensor`` and ``nn.Parameter`` of fp16/bf16/fp32/ fp64,
found in tuples, lists, dicts (so ``ModelOutput``) and dataclasses, two levels deep; other objects
(caches, tensor subclasses, int tensors) are not recorded.

Backward without module backward hooks (Dynamo does not trace those; the model would run
eagerly): the forward pre-hook passes each input that requires grad through ``Tap`` and the
forward hook does the same with the outputs. ``Tap`` returns ``x.detach()``, a tensor sharing
``x``'s memory and version counter that is not a view (so in-place ops on it, e.g.
``ReLU(inplace=True)``, keep working) with ``Tap`` as its grad_fn; its backward records the
gradient and passes it on unchanged. Dynamo traces both hooks and ``Tap`` into the graph (no
graph break), and the backward records run inside the compiled backward.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from ..nn.linear import LowbitModule, TransposedLinear
from ..nn.state import LinearState
from ..scaling.delayed import DelayedScalingState
from ..scaling.recipes import Delayed
from .stats import STAT_DTYPES, record_impl

__all__ = ["Site", "Layout", "watched_modules", "tensors_in", "map_tensors", "Tap", "call_record", "install"]

PHASES = ("forward", "backward")
DEPTH = 2


@dataclass(frozen=True)
class Site:
    module: str
    phase: str
    tensor: str
    recipe: str = ""  # lowbit.nn.spec.encode of the cast's recipe ("" for none)
    role: str = ""
    fmt: str = ""
    delayed: bool = False


class Layout:
    """The rows of one monitor: ``sites[i]`` is row i; ``slot(module, phase, tensor)``."""

    def __init__(self):
        self.sites: List[Site] = []
        self.index: Dict[Tuple[str, str, str], int] = {}
        self.modules: Dict[str, List[int]] = {}
        self.backward = np.zeros(0, dtype=bool)  # which rows are backward ones (set by layout_for)

    def add(self, site: Site) -> int:
        key = (site.module, site.phase, site.tensor)
        if key not in self.index:
            self.index[key] = len(self.sites)
            self.sites.append(site)
            self.modules.setdefault(site.module, []).append(self.index[key])
        return self.index[key]

    def slot(self, module: str, phase: str, tensor: str) -> Optional[int]:
        return self.index.get((module, phase, tensor))


def watched_modules(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    state_types = (LinearState, DelayedScalingState)
    skip = set()
    for name, m in model.named_modules():
        if isinstance(m, state_types):
            skip.update(id(x) for x in m.modules())
    return [(n, m) for n, m in model.named_modules() if id(m) not in skip]


# ---- finding tensors in what a module takes and returns --------------------------------------
def _is_stat_tensor(t) -> bool:
    return type(t) in (torch.Tensor, nn.Parameter) and t.dtype in STAT_DTYPES


def tensors_in(obj, depth: int = 0) -> List[torch.Tensor]:
    if _is_stat_tensor(obj):
        return [obj]
    if depth > DEPTH:
        return []
    if isinstance(obj, (tuple, list)):
        return [t for v in obj for t in tensors_in(v, depth + 1)]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_in(v, depth + 1)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in tensors_in(getattr(obj, f.name, None), depth + 1)]
    return []


def map_tensors(obj, fn: Callable, depth: int = 0):
    """``obj`` with ``fn(t)`` for each tensor ``tensors_in`` finds: tuples are rebuilt (namedtuples
    too), lists are new lists, dicts (``ModelOutput``) and dataclasses are updated in place."""
    if _is_stat_tensor(obj):
        return fn(obj)
    if depth > DEPTH:
        return obj
    if isinstance(obj, tuple):
        items = [map_tensors(v, fn, depth + 1) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, list):
        return [map_tensors(v, fn, depth + 1) for v in obj]
    if isinstance(obj, dict):
        for k in list(obj.keys()):
            obj[k] = map_tensors(obj[k], fn, depth + 1)
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        params = getattr(type(obj), "__dataclass_params__", None)
        if params is not None and params.frozen:
            return obj  # recorded, not tapped: a frozen dataclass can't take the tapped tensor
        for f in dataclasses.fields(obj):
            setattr(obj, f.name, map_tensors(getattr(obj, f.name, None), fn, depth + 1))
    return obj


# ---- the record call and the backward tap ---------------------------------------------------
def call_record(stats, x, sid, slot, scale=None, recipe="", role="", prime=False, when=-1) -> None:
    """``torch.ops.lowbit_monitor.record`` under torch.compile (the op it traces), else the op's
    Python implementation directly (the same function, without the dispatcher's host cost)."""
    if torch.compiler.is_compiling():
        torch.ops.lowbit_monitor.record(stats, x, sid, slot, scale, recipe, role, prime, False, when)
    else:
        record_impl(stats, x, sid, slot, scale, recipe, role, prime, True, when)


class Tap(torch.autograd.Function):
    """Identity in the forward (``x.detach()``: same memory, not a view); the backward records the
    gradient in ``stats[slot]`` (and hands it to ``keep``, the flight recorder, when given)."""

    @staticmethod
    def forward(ctx, x, stats, sid, slot, scale, recipe, role, prime, keep):
        ctx.set_materialize_grads(False)
        ctx.stats, ctx.scale, ctx.keep = stats, scale, keep
        ctx.meta = (sid, slot, recipe, role, prime)
        return x.detach()

    @staticmethod
    def backward(ctx, g):
        if g is not None:
            sid, slot, recipe, role, prime = ctx.meta
            call_record(ctx.stats, g, sid, slot, ctx.scale, recipe, role, prime)
            if ctx.keep is not None:
                ctx.keep(g)
        return g, None, None, None, None, None, None, None, None


def _cast_of(mod) -> Optional[dict]:
    """For a lowbit layer: its recipe key and, under delayed scaling, its scale buffers."""
    if not isinstance(mod, LowbitModule):
        return None
    st = mod.lowbit_state
    delayed = isinstance(st.recipe, Delayed)
    return {"recipe": st.recipe_key, "delayed": delayed, "state": st,
            "fmt": {r: st.recipe.format(r).name for r in ("input", "weight", "grad")}}


def _operand(mod, pname: str, p: torch.Tensor) -> torch.Tensor:
    """The weight as the layer's GEMM takes it: (out, in) (Conv1D's is stored transposed)."""
    return p.t() if isinstance(mod, TransposedLinear) and pname == "weight" else p


def layout_for(model: nn.Module) -> Tuple[Layout, list]:
    """Rows for every watched module and its own parameters; returns (layout, plan) with plan
    entries (name, module, cast info, [(param name, param, forward slot, backward slot)])."""
    lay, plan, owner = Layout(), [], {}
    for name, mod in watched_modules(model):
        cast = _cast_of(mod)
        fmt = cast["fmt"] if cast else {}
        rk = cast["recipe"] if cast else ""
        dl = bool(cast and cast["delayed"])
        lay.add(Site(name, "forward", "input", rk, "input" if rk else "", fmt.get("input", ""), dl))
        lay.add(Site(name, "forward", "output"))
        lay.add(Site(name, "backward", "grad_output", rk, "grad" if rk else "", fmt.get("grad", ""), dl))
        lay.add(Site(name, "backward", "grad_input"))
        params = []
        for pname, p in mod.named_parameters(recurse=False):
            w = cast is not None and pname == "weight"
            fs = lay.add(Site(name, "forward", pname, rk if w else "", "weight" if w else "",
                              fmt.get("weight", "") if w else "", dl and w))
            bs = None
            if p.requires_grad and id(p) not in owner:
                owner[id(p)] = name
                bs = lay.add(Site(name, "backward", pname))
            params.append((pname, p, fs, bs))
        plan.append((name, mod, cast, params))
    lay.backward = np.array([s.phase == "backward" for s in lay.sites], dtype=bool)
    return lay, plan


def install(mon, plan, lay: Layout, handles: list) -> None:
    """Register the hooks of monitor ``mon`` (its ``stats`` for the forward records, ``bstats``
    for the backward ones, ``session``, flight retention), appending the removable handles to
    ``handles`` as they are made.

    Two buffers, because a compiled graph saves what ``Tap`` holds for its backward and checks its
    version when the backward starts: the backward buffer is not written between the forward and
    the backward, the forward one is (by every later record of the forward)."""
    for name, mod, cast, params in plan:
        handles += _module_hooks(mon, name, mod, cast, params, lay)
        for pname, p, fs, bs in params:
            if bs is not None:
                handles.append(p.register_post_accumulate_grad_hook(_grad_hook(mon, bs)))


def _grad_hook(mon, slot):
    def hook(p):
        if p.grad is not None:
            call_record(mon.bstats, p.grad, mon.session.id, slot)
    return hook


def _module_hooks(mon, name, mod, cast, params, lay: Layout):
    s_in, s_out = lay.slot(name, "forward", "input"), lay.slot(name, "forward", "output")
    s_gout, s_gin = lay.slot(name, "backward", "grad_output"), lay.slot(name, "backward", "grad_input")
    rk = cast["recipe"] if cast else ""
    pending = {}

    def pre(module, args, kwargs):
        stats, sid = mon.stats, mon.session.id
        xs = tensors_in((args, kwargs))
        scale_in = prime_in = None
        if cast is not None:
            st = cast["state"]
            cold = st.cold_start()
            pending["cold"] = cold
            if cast["delayed"]:
                scale_in, prime_in = st.input.scale, cold[0]
        later = []  # recorded by the forward hook, if the output is non-finite
        for i, t in enumerate(xs):
            if rk and i == 0:
                call_record(stats, t, sid, s_in, scale_in, rk, "input", bool(prime_in))
            else:
                later.append((t, s_in))
        for pname, p, fs, _ in params:
            if rk and pname == "weight":
                st = cast["state"]
                call_record(stats, _operand(module, pname, p), sid, fs, st.weight.scale if cast["delayed"] else None,
                            rk, "weight", bool(cast["delayed"] and pending["cold"][1]))
            else:
                later.append((p, fs))
        pending["later"] = later
        if mon.retaining and not torch.compiler.is_compiling():
            mon.retain_forward(name, module, args, kwargs)
        if not (torch.is_grad_enabled() and any(t.requires_grad for t in xs)):
            return None
        bstats = mon.bstats

        def tap(t):
            return Tap.apply(t, bstats, sid, s_gin, None, "", "", False, None) if t.requires_grad else t
        return map_tensors((args, kwargs), tap)

    def post(module, args, out):
        stats, sid = mon.stats, mon.session.id
        ys = tensors_in(out)
        for t in ys:
            call_record(stats, t, sid, s_out)
        for t, slot in pending.pop("later", ()):
            call_record(stats, t, sid, slot, when=s_out)
        if not (torch.is_grad_enabled() and any(t.requires_grad for t in ys)):
            return None
        scale_g, prime_g = None, False
        if cast is not None and cast["delayed"]:
            scale_g, prime_g = cast["state"].grad.scale, bool(pending.get("cold", (False,) * 3)[2])
        keep = mon.keeper(name) if mon.retaining and not torch.compiler.is_compiling() else None
        bstats, role = mon.bstats, "grad" if rk else ""

        def tap(t):
            return Tap.apply(t, bstats, sid, s_gout, scale_g, rk, role, prime_g, keep) if t.requires_grad else t
        return map_tensors(out, tap)

    return [mod.register_forward_pre_hook(pre, with_kwargs=True), mod.register_forward_hook(post)]
