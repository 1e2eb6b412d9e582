"""Flight recorder: the culprit's tensors saved to a file, and ``lowbit replay FILE``.

Recording (``lowbit.monitor(model, flight=PATH)``): every watched module keeps, until its step
ends, references to its forward args and kwargs, a copy of its lowbit recipe state as the forward
found it, and the gradients of its outputs; the step is read at its end, and on the run's first
culprit the file gets a hook-free copy of the module (its parameters as they are then: before the
optimizer step with ``optimizer=``, else at ``mon.step()``), its recipe state from before the
forward, its inputs and the gradients of its outputs, all on the CPU. The references cost memory
(activations and gradients live until the step ends) and the read a host sync per step: a tool to
reproduce a fault, off by default. Eager only: a compiled step records statistics and events but
keeps no tensors (the file then holds the module alone).

Replay (``replay(path)``): the module is run as recorded ("its format": lowbit layers through
their recipe's casts, on the CPU's exact emulation by default) and as a float64 copy (lowbit
layers put back to plain layers), and the two are compared where they part:

* lowbit layers, by stage: the input cast, the weight cast (elements that saturate, flush, or come
  out non-finite), the GEMM output;
* other modules, op by op: each torch function the forward calls (``TorchFunctionMode``; the two
  runs call the same ones), the first whose output is non-finite in the format run, and whether
  float64 is finite there (the precision: they part) or not (the data: shown with the non-finite
  inputs or parameters it came from);
* a backward culprit: the forward again with the recorded output gradients, then every input and
  parameter gradient compared.
"""
from __future__ import annotations

import copy
from typing import List, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..nn.linear import LowbitModule, TransposedLinear
from .events import Event
from .hooks import map_tensors, tensors_in

__all__ = ["state_snapshot", "save", "load", "replay"]

FORMAT = "lowbit.flight/1"
SHOW = 5  # elements listed per finding


def state_snapshot(module: nn.Module) -> Optional[dict]:
    """A lowbit layer's recipe state (buffers and extra state), copied; None for other modules."""
    if not isinstance(module, LowbitModule):
        return None
    return {k: (v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v))
            for k, v in module.lowbit_state.state_dict().items()}


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").clone()
        return t.requires_grad_(obj.requires_grad) if t.is_floating_point() else t
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to_cpu(v) for v in obj) if not hasattr(obj, "_fields") else type(obj)(*map(_to_cpu, obj))
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return None  # caches and other objects are not recorded


def _clean_copy(module: nn.Module) -> nn.Module:
    m = copy.deepcopy(module)
    for sub in m.modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                     "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called"):
            d = getattr(sub, attr, None)
            if d is not None:
                d.clear()
        sub._is_full_backward_hook = None
    for p in m.parameters():
        p.grad = None
    return m.to("cpu")


def save(path: str, event: Event, module: Optional[nn.Module], fwd, grads, params_before_update: bool) -> str:
    rec = {"format": FORMAT, "event": event.as_dict(), "torch": torch.__version__,
           "params": "before the optimizer step" if params_before_update else "at mon.step()",
           "module": None, "args": None, "kwargs": None, "grad_output": None}
    if module is not None:
        m = _clean_copy(module)
        if fwd is not None and fwd[2] is not None:
            m.lowbit_state.load_state_dict({k: _to_cpu(v) for k, v in fwd[2].items()})
        rec["module"] = m
    if fwd is not None:
        rec["args"], rec["kwargs"] = _to_cpu(fwd[0]), _to_cpu(fwd[1])
    if grads:
        rec["grad_output"] = [g.detach().to("cpu").clone() for g in grads]
    torch.save(rec, path)
    return path


def load(path: str, device="cpu") -> dict:
    """A flight record (a pickle: load only files you trust)."""
    rec = torch.load(path, map_location=device, weights_only=False)
    if not (isinstance(rec, dict) and rec.get("format") == FORMAT):
        raise ValueError(f"{path} is not a lowbit flight record")
    return rec


# ---- describing tensors ------------------------------------------------------------------------
def _bad(t: torch.Tensor) -> torch.Tensor:
    return ~torch.isfinite(t.detach())


def _where(t: torch.Tensor, mask: torch.Tensor, other: Optional[torch.Tensor] = None) -> str:
    idx = torch.nonzero(mask)[:SHOW]
    parts = []
    for i in idx.tolist():
        v = t[tuple(i)].item()
        parts.append(f"{i}={v:.4g}" + (f" (float64 {other[tuple(i)].item():.6g})" if other is not None else ""))
    more = int(mask.sum()) - len(parts)
    return ", ".join(parts) + (f", ... {more} more" if more > 0 else "")


def _describe(name: str, t: torch.Tensor) -> str:
    bad = _bad(t)
    n = int(bad.sum())
    fin = t.detach()[~bad]
    amax = f"amax {fin.abs().max().item():.4g}" if fin.numel() else "no finite element"
    head = f"  {name}: {str(t.dtype).replace('torch.', '')} {tuple(t.shape)}, {amax}"
    return head + (f", {n} non-finite at {_where(t, bad)}" if n else ", finite")


class _OpLog(TorchFunctionMode):
    """Every torch function the forward calls, with its floating outputs."""

    def __init__(self):
        super().__init__()
        self.ops: List[tuple] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ts = tensors_in(out)
        if ts:
            self.ops.append((getattr(func, "__name__", str(func)), [t.detach() for t in ts]))
        return out


def _float64(module: nn.Module) -> nn.Module:
    from ..convert import unconvert
    return unconvert(copy.deepcopy(module)).double()


def _as64(obj):
    return map_tensors(obj, lambda t: t.detach().double().requires_grad_(t.requires_grad))


def _run(module, args, kwargs, grads, log: bool):
    """(outputs, op log, input and parameter gradients by name) of one replay."""
    args = map_tensors(args, lambda t: t.detach().clone().requires_grad_(t.requires_grad))
    kwargs = map_tensors(kwargs, lambda t: t.detach().clone().requires_grad_(t.requires_grad))
    ins = [t for t in tensors_in((args, kwargs)) if t.requires_grad]
    mode = _OpLog() if log else None
    with torch.set_grad_enabled(grads is not None):
        if mode is not None:
            with mode:
                out = module(*args, **kwargs)
        else:
            out = module(*args, **kwargs)
    outs = tensors_in(out)
    got = {}
    if grads is not None:
        pairs = [(o, g.to(o.dtype)) for o, g in zip(outs, grads) if o.requires_grad]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        got = {f"grad of input {i}": t.grad for i, t in enumerate(ins) if t.grad is not None}
        got.update({f"grad of {n}": p.grad for n, p in module.named_parameters() if p.grad is not None})
    return outs, (mode.ops if mode else None), got


def _lowbit_stages(m, x: torch.Tensor) -> List[str]:
    from ..dtypes.quantize import dequantize, quantize
    from .stats import cast_scale, saturation_limit
    st, r = m.lowbit_state, m.recipe
    cold = st.cold_start()
    w = m.weight.t() if isinstance(m, TransposedLinear) else m.weight
    lines = []
    for role, t, prime in (("input", x.reshape(-1, x.shape[-1]), cold[0]), ("weight", w, cold[1])):
        t = t.detach()
        scale = getattr(st, role).scale if hasattr(st, role) else None
        s, fmt = cast_scale(t, r, role, scale, prime)
        y = (t.float() / s).abs()
        dq = dequantize(quantize(t.float(), fmt, s), fmt, s)
        sat, bad_in, bad_out = (y > saturation_limit(fmt)) & torch.isfinite(t), _bad(t), _bad(dq)
        flushed = (t != 0) & (dq == 0)
        line = (f"  cast {role} ({fmt.name}, scale {float(s.max()):.4g}): {int(sat.sum())} saturated, "
                f"{int(flushed.sum())} flushed to 0, {int(bad_in.sum())} non-finite in, {int(bad_out.sum())} out")
        if sat.any():
            line += f"; saturated at {_where(t, sat)}"
        if (bad_out & ~bad_in).any():
            line += f"; made non-finite at {_where(t, bad_out & ~bad_in)}"
        lines.append(line)
    return lines


def _compare_ops(ops_f, ops_d) -> List[str]:
    if ops_f is None or ops_d is None or [n for n, _ in ops_f] != [n for n, _ in ops_d]:
        return ["  (the two runs call different torch functions: compared at the outputs only)"]
    for i, ((name, fo), (_, do)) in enumerate(zip(ops_f, ops_d)):
        for j, (a, b) in enumerate(zip(fo, do)):
            if a.shape != b.shape:
                continue
            bad = _bad(a)
            if not bad.any():
                continue
            part = bad & torch.isfinite(b)
            if part.any():
                return [f"  op #{i} {name} (output {j}): they part here: {int(part.sum())} element(s) non-finite in "
                        f"the format, finite in float64: {_where(a, part, b)}"]
            return [f"  op #{i} {name} (output {j}): non-finite in both runs ({int(bad.sum())} element(s)): the "
                    f"non-finite values come from the data, not the precision"]
    return ["  no op made a non-finite value"]


def replay(path: str, device="cpu") -> str:
    """Re-run the recorded culprit in its format and in float64; the comparison as text."""
    rec = load(path, device)
    ev = rec["event"]
    lines = [f"flight record {path}: step {ev['step']}, {ev['kind']} in {ev['module'] or '<root>'} "
             f"{ev['phase']} {ev['tensor']} ({ev['value']:.6g}); parameters {rec['params']}"]
    m = rec["module"]
    if m is None:
        return "\n".join(lines + ["  the module was not found in the model: nothing to replay"])
    lines.append(f"module: {type(m).__module__}.{type(m).__qualname__}"
                 + (f", recipe {m.recipe!r}" if isinstance(m, LowbitModule) else ""))
    lines.append("parameters:")
    lines += [_describe(n, p) for n, p in m.named_parameters()]
    if rec["args"] is None:
        return "\n".join(lines + ["  no inputs were recorded (the step ran compiled, or before the recorder "
                                  "started): re-run the step eagerly with flight= to replay it"])
    args, kwargs = rec["args"], rec["kwargs"] or {}
    lines.append("inputs:")
    lines += [_describe(f"input {i}", t) for i, t in enumerate(tensors_in((args, kwargs)))]
    grads = rec["grad_output"] if ev["phase"] == "backward" else None
    if ev["phase"] == "backward" and grads is None:
        lines.append("  (no output gradient was recorded: the forward alone is replayed)")
    if grads:
        lines.append("output gradients:")
        lines += [_describe(f"grad_output {i}", g) for i, g in enumerate(grads)]
    m.train()
    out_f, ops_f, g_f = _run(m, args, kwargs, grads, log=not isinstance(m, LowbitModule))
    m64 = _float64(m)
    out_d, ops_d, g_d = _run(m64, _as64(args), _as64(kwargs), [g.double() for g in grads] if grads else None,
                             log=not isinstance(m, LowbitModule))
    n_f = sum(int(_bad(t).sum()) for t in out_f)
    n_d = sum(int(_bad(t).sum()) for t in out_d)
    lines.append(f"replay: outputs non-finite: {n_f} in its format, {n_d} in float64")
    lines.append("where they part:")
    if isinstance(m, LowbitModule):
        lines += _lowbit_stages(m, tensors_in(args)[0])
        for j, (a, b) in enumerate(zip(out_f, out_d)):
            part = _bad(a) & torch.isfinite(b)
            if part.any():
                lines.append(f"  GEMM output {j}: {int(part.sum())} non-finite in the format, finite in float64: "
                             f"{_where(a, part, b)}")
    else:
        lines += _compare_ops(ops_f, ops_d)
    for k, g in g_f.items():
        part = _bad(g)
        if part.any():
            ref = g_d.get(k)
            fin64 = ref is not None and bool(torch.isfinite(ref[part]).all())
            also = "finite" if fin64 else "also non-finite"
            lines.append(f"  {k}: {int(part.sum())} non-finite in the format ({also} in float64) at "
                         f"{_where(g, part, ref if fin64 else None)}")
    lines.append("reproduced: " + ("yes" if n_f or any(_bad(g).any() for g in g_f.values()) else "no (the fault did "
                                   "not recur with these tensors)"))
    return "\n".join(lines)
