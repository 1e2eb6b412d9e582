"""``lowbit.monitor``: live numerics of a training run, on the device, the first NaN localised.

    mon = lowbit.monitor(model, every=1, log="numerics.jsonl")
    for batch in data:
        model(**batch).loss.backward(); opt.step(); opt.zero_grad()
        mon.step()                      # one asynchronous device -> host copy per step
    mon.first_nonfinite                 # Event(kind, step, module, phase, tensor, value): the culprit
    mon.report()                        # terminal table (JSON lines / TensorBoard with log=)

``lowbit.monitor`` is this package, and calling it calls ``monitor`` (the package's module object
is a callable ``types.ModuleType`` subclass), so ``lowbit.monitor(model)``,
``lowbit.monitor.Event`` and ``from lowbit.monitor import Monitor, NumericsError`` all work.

Parts: ``hooks`` (what is watched, from outside ``lowbit.nn``), ``stats`` and ``stats_kernel``
(the device buffer, the record op, the fused Triton reduction), ``registry`` (the per-step
switches the op reads), ``events`` (events and the culprit), ``watch`` (``Monitor``), ``sinks``
(JSON lines, TensorBoard, the report), ``flight`` (flight recorder and replay), ``plot`` (PNGs).
"""
from __future__ import annotations

import sys
import types

from .events import Event, NumericsError, Thresholds
from .watch import Monitor

__all__ = ["monitor", "Monitor", "Event", "NumericsError", "Thresholds"]


def monitor(model, every: int = 1, log=None, on_anomaly="warn", optimizer=None, **options) -> Monitor:
    """Watch every module of ``model``: forward inputs, outputs and parameters, backward output and
    input gradients and parameter gradients, and for lowbit layers each cast (input, weight, grad)
    with its scale. Per step and tensor, on the device: NaN+Inf count, amax, and for casts the
    fraction saturated (``|x / scale|`` beyond what rounds to ``fmax``), the fraction of non-zeros flushed to zero, the
    scale, for delayed scaling how far the amax overshot the range the scale covers
    (``amax_ratio``), and with ``sqnr_every=N`` the SQNR in dB every N steps.

    ``every``: monitor steps 0, N, 2N, ... (the records of other steps return at once).
    ``log``: a path (JSON lines), ``"tb:DIR"`` (TensorBoard), or a list of them.
    ``on_anomaly``: "warn" (one warning per event kind and module), "raise"
    (``NumericsError`` carrying the event, from the ``step()`` that ends the step), "record", or
    a callable taking each ``Event``.
    ``optimizer``: end the step in its step pre-hook instead of calling ``mon.step()``.
    Options: ``sqnr_every`` (0: never), ``thresholds`` (``Thresholds(overflow, underflow)``:
    fractions above which a cast makes an event), ``flight`` (a path: the flight recorder,
    ``lowbit.monitor.flight``), ``device`` (of the statistics; default the model's),
    ``max_events`` (events kept), ``kernel`` (False: torch ops instead of the Triton reduction).

    Returns a ``Monitor`` (also a context manager that detaches on exit). Attaching twice gives
    two independent monitors; ``detach()`` twice is a no-op."""
    return Monitor(model, every, log, on_anomaly, optimizer, **options)


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs) -> Monitor:
        return monitor(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
