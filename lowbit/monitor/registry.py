"""What the ``record`` op reads when it runs: the live monitors' per-step switches and their window
of tensors recorded a moment ago (``Session``), found by id in the registry ``SESSIONS``.

The op runs at call time even inside a compiled graph, so these switches act on compiled models
without a recompile: ``active`` (this step is monitored, ``every``), ``sqnr_due`` (this step
measures SQNR). Inside a CUDA graph the op ran once, at capture, and the graph replays what it
launched then: every replay records, whatever ``every`` says.

The window (``seen`` / ``remember``; eager only, see ``stats.record``): a module's input is
usually the output of the module that ran just before, or the input its parent has just recorded.
A tensor whose memory (data pointer, dtype, element count, contiguous) and version match one of
the last ``WINDOW`` tensors recorded is not read again: its row is noted as an alias of the first
one (``aliases``), which the monitor resolves when it reads the step. The window holds references,
so no tensor in it is freed and its memory reused within the window; it is emptied at every step.
Skipped while a CUDA graph is being captured (a replay must record every tensor itself).
"""
from __future__ import annotations

import itertools
import warnings
from typing import Dict, Optional, Set

import torch

from ..nn.spec import decode

__all__ = ["Session", "SessionRegistry", "SESSIONS", "WINDOW"]

WINDOW = 4


def _key(t: torch.Tensor):
    return (t.data_ptr(), t.dtype, t.numel(), t.is_contiguous(), t._version)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class Session:
    def __init__(self, sid: int, name: str, kernel: bool = True):
        self.id, self.name, self.kernel = sid, name, kernel
        self.active = True
        self.sqnr_due = False
        self.window: list = []  # [(tensor, key, slot)]
        self.aliases: Dict[int, Set[int]] = {}
        self._warned: set = set()
        self.plans: dict = {}  # the stats kernels' launches, by what each specializes on (stats_kernel)
        self._recipes: Dict[str, object] = {}

    def recipe(self, key: str):
        """The recipe of a ``lowbit.nn.spec.encode`` key, decoded once."""
        r = self._recipes.get(key)
        if r is None:
            r = self._recipes[key] = decode(key)
        return r

    def seen(self, x: torch.Tensor, slot: int) -> bool:
        if _capturing() or not self.window or x.is_inference():
            return False
        k = _key(x)
        for t, key, src in self.window:
            if t is x or key == k:
                if src != slot:
                    self.aliases.setdefault(slot, set()).add(src)
                return True
        return False

    def remember(self, x: torch.Tensor, slot: int) -> None:
        if _capturing() or x.is_inference():  # (inference tensors have no version counter)
            return
        self.window.append((x, _key(x), slot))
        if len(self.window) > WINDOW:
            del self.window[0]

    def new_step(self) -> Dict[int, Set[int]]:
        """Empty the window; return the aliases noted since the last call."""
        self.window.clear()
        out, self.aliases = self.aliases, {}
        return out

    def warn_once(self, key, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"lowbit.monitor ({self.name}): {message}", stacklevel=3)

    def warn_device(self, device: torch.device) -> None:
        self.warn_once(device, f"a tensor on {device} but the statistics live on another device; each record is "
                               "copied over (a host sync). Attach the monitor after moving the model, or pass device=.")


class SessionRegistry:
    """The attached monitors' sessions by id (an explicit registry; ids are never reused)."""

    def __init__(self):
        self._live: Dict[int, Session] = {}
        self._ids = itertools.count(1)

    def open(self, name: str, kernel: bool = True) -> Session:
        s = Session(next(self._ids), name, kernel)
        self._live[s.id] = s
        return s

    def close(self, sid: int) -> None:
        self._live.pop(sid, None)

    def get(self, sid: int) -> Optional[Session]:
        return self._live.get(sid)


SESSIONS = SessionRegistry()
