"""``Monitor``: what ``lowbit.monitor(model, ...)`` returns.

A step's statistics accumulate on the device (``stats`` for the forward, ``bstats`` for the
backward, see ``hooks.install``); ``step()`` ends the step by stacking both into one device buffer
and one asynchronous copy of it to the host (pinned memory on CUDA, a ring of two) and a reset,
then reads the step before: by then its copy has long landed, so nothing waits for the device but
a CPU that ran more than one step ahead. Events, the culprit and the sinks come from that read.
``events``, ``first_nonfinite``, ``report()``, ``flush()`` and ``detach()`` read every step still
in flight first. Two exceptions read the step at once (one host sync per step):
``on_anomaly="raise"`` (the error comes from the ``step()`` that ends the faulty step) and the
flight recorder (it must keep the culprit's tensors until it knows).

``optimizer=``: the step ends in the optimizer's step pre-hook (before the parameters change); do
not call ``step()`` as well.

torch.compile: attach before compiling, or pass the compiled model (``torch.compile(model)``'s
wrapper, or a model with modules compiled in place by ``module.compile()``): Dynamo does not guard
on module hooks, so attaching and detaching then reset its caches (``torch._dynamo.reset()``) and
the next call traces again. (Hooks added to the plain model behind a compiled wrapper that has
already run are not seen until such a reset.) The hooks, ``Tap`` and the record op trace without a
graph break, the per-step switches live in the op (no recompile). Under torch.compile no tensor is
skipped as already seen (``stats.record``). CUDA graphs (``mode="reduce-overhead"``): the buffers
have static addresses and the records write them in place, so each replay adds its statistics
and ``step()`` reads and resets them outside the graph; a replay records whatever its capture
recorded (``every`` and SQNR steps apply to eager and compiled steps only).
"""
from __future__ import annotations

import warnings
from typing import Callable, List, Optional, Union

import torch
from torch import nn

from .events import Event, NumericsError, Thresholds, read_step
from .hooks import install, layout_for
from .registry import SESSIONS
from .sinks import Totals, make_sinks, report
from .stats import new_buffer, reset_template

__all__ = ["Monitor", "ANOMALY_ACTIONS"]

ANOMALY_ACTIONS = ("warn", "raise", "record")
RING = 2


def _unwrap(model: nn.Module):
    """(the module to watch, whether any of it was compiled): ``torch.compile(model)``'s wrapper
    is watched through the model it wraps; ``module.compile()`` compiles a module (or a block of
    it: regional compilation) in place."""
    inner = getattr(model, "_orig_mod", None)
    if isinstance(inner, nn.Module):
        return inner, True
    return model, any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())


def _device_of(model: nn.Module, device) -> torch.device:
    if device is not None:
        return torch.device(device)
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


class Monitor:
    """Live numerics of ``model``: see ``lowbit.monitor``."""

    def __init__(self, model: nn.Module, every: int = 1, log=None, on_anomaly: Union[str, Callable] = "warn",
                 optimizer=None, *, sqnr_every: int = 0, thresholds: Thresholds = Thresholds(),
                 flight: Optional[str] = None, device=None, max_events: int = 100_000, kernel: bool = True):
        if not isinstance(model, nn.Module):
            raise TypeError(f"lowbit.monitor watches an nn.Module, got {type(model).__name__}")
        for name, v, lo in (("every", every, 1), ("sqnr_every", sqnr_every, 0), ("max_events", max_events, 0)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"lowbit.monitor: {name} must be an int >= {lo}, got {v!r}")
        if not (callable(on_anomaly) or on_anomaly in ANOMALY_ACTIONS):
            raise ValueError(f"lowbit.monitor: on_anomaly must be one of {ANOMALY_ACTIONS} or a callable, "
                             f"got {on_anomaly!r}")
        if optimizer is not None and not hasattr(optimizer, "register_step_pre_hook"):
            raise TypeError(f"lowbit.monitor: optimizer= takes a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not isinstance(thresholds, Thresholds):
            raise TypeError("lowbit.monitor: thresholds= takes a lowbit.monitor.Thresholds")
        model, self._compiled = _unwrap(model)
        self.model, self.every, self.on_anomaly, self.sqnr_every = model, every, on_anomaly, sqnr_every
        self.thresholds, self.flight, self.max_events, self.optimizer = thresholds, flight, max_events, optimizer
        self.device = _device_of(model, device)
        self.layout, plan = layout_for(model)
        n = len(self.layout.sites)
        self.stats, self.bstats = new_buffer(n, self.device), new_buffer(n, self.device)  # forward, backward
        self._template = reset_template(n, self.device)
        self._stage = torch.empty((2, *self.stats.shape), dtype=self.stats.dtype, device=self.device)
        pin = self.device.type == "cuda"
        self._host = [torch.empty_like(self._stage, device="cpu", pin_memory=pin) for _ in range(RING)]
        self._pending: list = []  # (step, ring index, event or None, aliases)
        self._sinks = make_sinks(log)
        self._events: List[Event] = []
        self.dropped_events = 0
        self._first: Optional[Event] = None
        self._warned: set = set()
        self.totals = Totals(n)
        self.steps = 0
        self.session = SESSIONS.open(type(model).__name__, kernel)
        self.retaining = flight is not None
        self._kept_fwd: dict = {}
        self._kept_bwd: dict = {}
        self.flight_saved: Optional[str] = None
        self._handles = []
        try:
            install(self, plan, self.layout, self._handles)
            if optimizer is not None:
                self._handles.append(optimizer.register_step_pre_hook(lambda opt, args, kwargs: self.step()))
        except BaseException:
            self.detach()
            raise
        self._set_switches()
        self._retrace()

    def _retrace(self) -> None:
        """Dynamo does not guard on module hooks: a compiled model must be traced anew to see them."""
        if self._compiled:
            torch._dynamo.reset()

    # ---- the step ---------------------------------------------------------------------------
    def _set_switches(self) -> None:
        self.session.active = self.steps % self.every == 0
        self.session.sqnr_due = bool(self.sqnr_every) and self.session.active and self.steps % self.sqnr_every == 0

    @property
    def attached(self) -> bool:
        return self._handles is not None

    def step(self) -> None:
        """End the step (see the module docstring)."""
        if not self.attached:
            raise RuntimeError("lowbit.monitor: step() after detach()")
        if self.session.active:
            k = self.steps % RING
            if any(p[1] == k for p in self._pending):
                self._read_all()
            torch.stack((self.stats, self.bstats), out=self._stage)
            self._host[k].copy_(self._stage, non_blocking=True)
            ev = None
            if self.device.type == "cuda":
                ev = torch.cuda.Event()
                ev.record()
            self.stats.copy_(self._template)
            self.bstats.copy_(self._template)
            self._pending.append((self.steps, k, ev, self.session.new_step()))
        now = self.on_anomaly == "raise" or self.retaining
        self.steps += 1
        self._set_switches()
        if now:
            self._read_all()
            self._kept_fwd.clear()
            self._kept_bwd.clear()
        else:
            while len(self._pending) > 1:
                self._read(self._pending.pop(0))

    def _read_all(self) -> None:
        while self._pending:
            self._read(self._pending.pop(0))

    def _read(self, item) -> None:
        step, k, ev, aliases = item
        if ev is not None:
            ev.synchronize()
        rep = read_step(step, self._host[k].numpy(), aliases, self.layout, self.thresholds)
        self.totals.add(rep)
        for s in self._sinks:
            s.write(rep, self.layout)
        room = self.max_events - len(self._events)
        self._events += rep.events[:max(room, 0)]
        self.dropped_events += max(len(rep.events) - max(room, 0), 0)
        if rep.culprit is not None and self._first is None:
            self._first = rep.culprit
            if self.retaining:
                self._save_flight(rep.culprit)
        self._act(rep)

    def _act(self, rep) -> None:
        if not rep.events or self.on_anomaly == "record":
            return
        ordered = ([rep.culprit] if rep.culprit else []) + [e for e in rep.events if e is not rep.culprit]
        if self.on_anomaly == "raise":
            raise NumericsError(ordered[0])
        for e in ordered:
            if callable(self.on_anomaly):
                self.on_anomaly(e)
            elif (e.kind, e.module) not in self._warned:
                self._warned.add((e.kind, e.module))
                lead = "first non-finite values made here: " if e is rep.culprit and e is self._first else ""
                warnings.warn(f"lowbit.monitor: {lead}{e}", RuntimeWarning, stacklevel=4)

    # ---- what a user reads --------------------------------------------------------------------
    def flush(self) -> None:
        """Read every step still in flight (waits for the device)."""
        self._read_all()

    @property
    def events(self) -> List[Event]:
        self._read_all()
        return list(self._events)

    @property
    def first_nonfinite(self) -> Optional[Event]:
        """The culprit: the first non-finite event made inside a module from finite values."""
        self._read_all()
        return self._first

    def report(self, print_it: bool = True) -> str:
        """The terminal summary (printed, and returned)."""
        self._read_all()
        text = report(self.totals, self.layout, self._first)
        if self.flight_saved:
            text += f"\nflight record: {self.flight_saved} (lowbit replay {self.flight_saved})"
        if print_it:
            print(text)
        return text

    # ---- flight recorder ----------------------------------------------------------------------
    def retain_forward(self, name, module, args, kwargs) -> None:
        from .flight import state_snapshot
        self._kept_fwd[name] = (args, kwargs, state_snapshot(module))

    def keeper(self, name):
        return lambda g: self._kept_bwd.setdefault(name, []).append(g)

    def _save_flight(self, culprit: Event) -> None:
        from .flight import save
        module = dict(self.model.named_modules()).get(culprit.module)
        try:
            self.flight_saved = save(self.flight, culprit, module, self._kept_fwd.get(culprit.module),
                                     self._kept_bwd.get(culprit.module), self.optimizer is not None)
        except Exception as e:  # e.g. a module that does not pickle: the run goes on
            warnings.warn(f"lowbit.monitor: flight record not saved ({type(e).__name__}: {e})", RuntimeWarning)

    # ---- detach ---------------------------------------------------------------------------------
    def detach(self) -> None:
        """Remove the hooks, read what is in flight, close the sinks. A second call does nothing."""
        if not self.attached:
            return
        for h in self._handles:
            h.remove()
        self._handles = None
        self._retrace()
        try:
            self._read_all()
        finally:
            SESSIONS.close(self.session.id)
            self._kept_fwd.clear()
            self._kept_bwd.clear()
            for s in self._sinks:
                s.close()

    close = detach

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc) -> None:
        self.detach()

    def __repr__(self) -> str:
        return (f"Monitor({type(self.model).__name__}, every={self.every}, steps={self.steps}, "
                f"tensors={len(self.layout.sites)}, attached={self.attached})")

