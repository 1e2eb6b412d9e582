"""Backend registry for scaled GEMMs: an explicit registry object, no hidden global switch.

A backend has a ``name``, ``supports(a, b, out_dtype, bias) -> None | str`` (None: it can run this
call; a string: why not) and ``scaled_mm(a, b, out_dtype, bias)`` (called with ``fast_accum=True``
when the caller allows unpromoted accumulation and the backend declares ``fast_accum``), and
optionally ``plan(a, b, out_dtype, bias, fast_accum) -> run | str`` (the support check and the
launch decisions made once for calls of that shape: ``run(a, b, bias)`` computes the product, a
string says why not; backends that have it are asked this instead of ``supports``) and fused
casts (``quantize_fp8``, ``quantize_fp8_t``, ``quantize_fp4``, same signatures as
``lowbit.kernels.api``, returning None to decline). ``select`` / ``select_run`` pick, for
``"auto"``, the registered backend of highest priority that supports the call; the ``"torch"``
emulation supports everything, so it is the fallback. When a preferred backend declines a call on
its own device (a shape it can't take, an old GPU), the registry warns once per reason and falls
back.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict

__all__ = ["Backend", "BackendRegistry", "BACKENDS"]


@dataclass(frozen=True)
class Backend:
    name: str
    scaled_mm: Callable
    supports: Callable = lambda a, b, out_dtype, bias: None  # noqa: E731
    priority: int = 0  # higher wins under "auto"
    devices: tuple = ("cpu", "cuda")  # device types the backend can serve at all
    # () -> more device types it serves when asked for by name (the Triton interpreter's CPU)
    named_devices: Callable = lambda: ()  # noqa: E731
    fast_accum: bool = False  # scaled_mm takes fast_accum= (a faster, unpromoted accumulation)
    # optional fused casts (lowbit.kernels.api); each returns None to decline a call
    quantize_fp8: Callable = None
    quantize_fp8_t: Callable = None
    quantize_fp4: Callable = None
    plan: Callable = None  # (a, b, out_dtype, bias, fast_accum) -> run(a, b, bias) | reason


@dataclass
class BackendRegistry:
    backends: Dict[str, Backend] = field(default_factory=dict)
    _warned: set = field(default_factory=set)
    _order: list = field(default_factory=list)  # by priority, highest first (kept by register)

    def register(self, backend: Backend) -> Backend:
        self.backends[backend.name] = backend
        self._order[:] = sorted(self.backends.values(), key=lambda x: -x.priority)
        return backend

    def by_priority(self) -> list:
        """The registered backends, highest priority first."""
        if len(self._order) != len(self.backends):  # a dict filled directly, not through register
            self._order[:] = sorted(self.backends.values(), key=lambda x: -x.priority)
        return self._order

    def get(self, name: str) -> Backend:
        try:
            return self.backends[name]
        except KeyError:
            raise ValueError(f"unknown backend {name!r}; registered: {sorted(self.backends)}") from None

    def select(self, name: str, a, b, out_dtype, bias=None) -> Backend:
        """The backend that runs this call: ``name`` itself (error if it can't), or for ``"auto"``
        the best one that can, warning once when a preferred backend declines."""
        if name != "auto":
            be = self.get(name)
            why = be.supports(a, b, out_dtype, bias)
            if why is not None:
                raise ValueError(f"backend {name!r} cannot run this scaled_mm: {why}")
            return be
        device = a.device.type
        for be in self.by_priority():
            if device not in be.devices:
                continue
            why = be.supports(a, b, out_dtype, bias)
            if why is None:
                return be
            self._decline(be, why)
        raise RuntimeError(f"no lowbit backend can run scaled_mm on {device}")

    def select_run(self, name: str, a, b, out_dtype, bias=None, fast_accum: bool = False):
        """``run(a, b, bias)`` of the backend that takes this call (``select``'s choice), through
        its ``plan`` where it has one (the one support check), else its ``scaled_mm``."""
        if name != "auto":
            be = self.get(name)
            run = _run_of(be, a, b, out_dtype, bias, fast_accum)
            if isinstance(run, str):
                raise ValueError(f"backend {name!r} cannot run this scaled_mm: {run}")
            return run
        device = a.device.type
        for be in self.by_priority():
            if device not in be.devices:
                continue
            run = _run_of(be, a, b, out_dtype, bias, fast_accum)
            if not isinstance(run, str):
                return run
            self._decline(be, run)
        raise RuntimeError(f"no lowbit backend can run scaled_mm on {device}")

    def _decline(self, be, why: str) -> None:
        key = (be.name, why)
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"lowbit: {be.name} backend declined scaled_mm ({why}); using the next backend",
                          stacklevel=4)

    def serves(self, name: str, device_type: str) -> bool:
        """Backend ``name``, asked for by name, can serve ``device_type`` tensors."""
        be = self.get(name)
        return device_type in be.devices or device_type in be.named_devices()

    def names(self) -> list:
        return sorted(self.backends)


def _run_of(be: Backend, a, b, out_dtype, bias, fast_accum: bool):
    """``run(a, b, bias)`` or the reason ``be`` declines."""
    if be.plan is not None:
        return be.plan(a, b, out_dtype, bias, fast_accum and be.fast_accum)
    why = be.supports(a, b, out_dtype, bias)
    if why is not None:
        return why
    if fast_accum and be.fast_accum:
        return lambda a, b, bias: be.scaled_mm(a, b, out_dtype, bias, fast_accum=True)
    return lambda a, b, bias: be.scaled_mm(a, b, out_dtype, bias)


BACKENDS = BackendRegistry()
