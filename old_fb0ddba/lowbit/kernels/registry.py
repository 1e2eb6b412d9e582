"""Backend registry for scaled GEMMs: an explicit registry object, no hidden global switch.

A backend has a ``name``, ``supports(a, b, out_dtype, bias) -> None | str`` (None: it can run this
call; a string: why not) and ``scaled_mm(a, b, out_dtype, bias)`` (called with ``fast_accum=True``
when the caller allows unpromoted accumulation and the backend declares ``fast_accum``), and
optionally fused casts
(``quantize_fp8``, ``quantize_fp8_t``, ``quantize_fp4``, same signatures as ``lowbit.kernels.cast``,
returning None to decline). ``select`` picks, for
``"auto"``, the registered backend of highest priority that supports the call; the ``"torch"``
emulation supports everything, so it is the fallback. When a preferred backend declines a call on
its own device (a shape it can't take, an old GPU), ``select`` warns once per reason and falls back.
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
    fast_accum: bool = False  # scaled_mm takes fast_accum= (a faster, unpromoted accumulation)
    # optional fused casts (lowbit.kernels.cast); each returns None to decline a call
    quantize_fp8: Callable = None
    quantize_fp8_t: Callable = None
    quantize_fp4: Callable = None


@dataclass
class BackendRegistry:
    backends: Dict[str, Backend] = field(default_factory=dict)
    _warned: set = field(default_factory=set)

    def register(self, backend: Backend) -> Backend:
        self.backends[backend.name] = backend
        return backend

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
        for be in sorted(self.backends.values(), key=lambda x: -x.priority):
            if device not in be.devices:
                continue
            why = be.supports(a, b, out_dtype, bias)
            if why is None:
                return be
            key = (be.name, why)
            if key not in self._warned:
                self._warned.add(key)
                warnings.warn(f"lowbit: {be.name} backend declined scaled_mm ({why}); "
                              "using the next backend", stacklevel=3)
        raise RuntimeError(f"no lowbit backend can run scaled_mm on {device}")

    def names(self) -> list:
        return sorted(self.backends)


BACKENDS = BackendRegistry()
