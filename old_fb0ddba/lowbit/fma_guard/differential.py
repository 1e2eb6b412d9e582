"""Differential run: the same kernel launched with fusion on and off, on adversarial inputs.

``differential(kernel, args, grid)`` clones every tensor argument per run (both runs start from
identical buffers), launches ``kernel[grid](*args, enable_fp_fusion=flag)`` for ``flag`` in
(True, False), and reports per output tensor: max |fused - unfused|, how many elements differ,
NaN/Inf counts in each run, and any ``probes`` (e.g. "positive exponent arguments" on an ``ARG``
buffer). Needs a CUDA GPU for a meaningful answer; under ``TRITON_INTERPRET=1`` on the CPU it runs
(numpy never contracts, so both runs agree) and serves to check the plumbing.

``adversarial_scores(rows, cols, scale)`` builds inputs where the hazard must show: the row max
``x*`` of every row has ``x* * s`` rounding *down* by at least a quarter ulp, so a contracted
``fma(x*, s, -round(x* * s))`` is positive, while the uncontracted argument is exactly 0.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

__all__ = ["differential", "DifferentialResult", "OutputDiff", "adversarial_scores"]


@dataclasses.dataclass(frozen=True)
class OutputDiff:
    name: str
    max_abs_diff: float
    n_differ: int
    numel: int
    nan_fused: int
    inf_fused: int
    nan_unfused: int
    inf_unfused: int


@dataclasses.dataclass(frozen=True)
class DifferentialResult:
    kernel: str
    outputs: tuple[OutputDiff, ...]
    probes: tuple[tuple[str, float, float], ...]  # (name, fused value, unfused value)

    @property
    def differs(self) -> bool:
        return any(o.n_differ for o in self.outputs)

    def format(self) -> str:
        lines = [f"{self.kernel}: fused vs unfused"]
        for o in self.outputs:
            lines.append(f"  {o.name}: max|diff| {o.max_abs_diff:.3g}, {o.n_differ}/{o.numel} differ, "
                         f"NaN {o.nan_fused}/{o.nan_unfused}, Inf {o.inf_fused}/{o.inf_unfused} (fused/unfused)")
        for name, f, u in self.probes:
            lines.append(f"  {name}: fused {f:g}, unfused {u:g}")
        return "\n".join(lines)


def _name(kernel) -> str:
    obj = kernel
    while hasattr(obj, "fn") and not hasattr(obj, "arg_names"):
        obj = obj.fn
    return getattr(obj, "__name__", repr(kernel))


def differential(kernel, args: Sequence, grid, *, constexprs: Mapping | None = None,
                 outputs: Sequence | None = None, probes: Mapping[str, Callable] | None = None,
                 launch_options: Mapping | None = None) -> DifferentialResult:
    """Run ``kernel`` fused and unfused; compare the tensors named (or indexed) in ``outputs``.

    ``args``: positional launch arguments; ``constexprs``: keyword constexpr values; ``outputs``:
    indices or parameter names of the tensors to compare (default: every tensor argument);
    ``probes``: ``{name: f(outs) -> number}`` where ``outs`` maps output names to tensors."""
    import torch

    from .compile import as_jit_function
    names = list(as_jit_function(kernel).arg_names)
    tensor_idx = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    if not tensor_idx:
        raise ValueError("differential: no tensor arguments to compare")
    if outputs is None:
        out_idx = tensor_idx
    else:
        out_idx = [names.index(o) if isinstance(o, str) else int(o) for o in outputs]
        bad = [i for i in out_idx if i not in tensor_idx]
        if bad:
            raise ValueError(f"differential: outputs {bad} are not tensor arguments")
    devices = {args[i].device.type for i in tensor_idx}
    if devices != {"cuda"} and not _interpreting():
        raise RuntimeError("differential needs CUDA tensors (or TRITON_INTERPRET=1 on the CPU, which never "
                           "contracts); use scan() to judge a kernel without a GPU")
    results = {}
    for fusion in (True, False):
        run_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        kernel[grid](*run_args, **dict(constexprs or {}), **dict(launch_options or {}), enable_fp_fusion=fusion)
        if devices == {"cuda"}:
            torch.cuda.synchronize()
        results[fusion] = {names[i]: run_args[i] for i in out_idx}
    diffs = []
    for name in results[True]:
        f, u = results[True][name], results[False][name]
        ff, uf = f.double(), u.double()
        both_nan = torch.isnan(ff) & torch.isnan(uf)
        same = (ff == uf) | both_nan
        finite = torch.isfinite(ff) & torch.isfinite(uf)
        d = (ff - uf).abs()[finite]
        diffs.append(OutputDiff(name=name, max_abs_diff=float(d.max()) if d.numel() else 0.0,
                                n_differ=int((~same).sum()), numel=f.numel(),
                                nan_fused=int(torch.isnan(ff).sum()), inf_fused=int(torch.isinf(ff).sum()),
                                nan_unfused=int(torch.isnan(uf).sum()), inf_unfused=int(torch.isinf(uf).sum())))
    pr = tuple((n, float(fn(results[True])), float(fn(results[False]))) for n, fn in (probes or {}).items())
    return DifferentialResult(kernel=_name(kernel), outputs=tuple(diffs), probes=pr)


def _interpreting() -> bool:
    from ..kernels.interpret import interpreting
    return interpreting()


def adversarial_scores(rows: int, cols: int, scale: float, *, magnitude: float = 8.0, seed: int = 0,
                       device="cpu"):
    """fp32 ``[rows, cols]`` scores whose unique row max ``x*`` has ``x* * scale`` rounding down by >= ulp/4.

    The other entries are uniform in ``(-0.999, 0.999) * magnitude / scale``; the max sits at a random
    column. ``scale`` must be a positive fp32 number; the exact product of two fp32 numbers is
    exact in float64, which is how the rounding error is measured."""
    import torch
    if rows < 1 or cols < 2:
        raise ValueError(f"adversarial_scores: need rows >= 1 and cols >= 2, got {rows}x{cols}")
    s32 = torch.tensor(scale, dtype=torch.float32)
    if not (float(s32) > 0 and torch.isfinite(s32)):
        raise ValueError(f"adversarial_scores: scale must be positive and finite, got {scale!r}")
    if not magnitude > 0:
        raise ValueError(f"adversarial_scores: magnitude must be positive, got {magnitude!r}")
    g = torch.Generator().manual_seed(seed)
    lo = magnitude / float(s32)
    # candidates for the row max: fp32 values in [lo, 1.25 lo) whose product with s rounds down a lot
    cand = (lo * (1 + 0.25 * torch.rand(64 * rows + 1024, generator=g, dtype=torch.float64))).float()
    p = cand.double() * float(s32)                      # exact
    r = p.float().double()                              # round to nearest even in fp32
    ulp = (torch.nextafter(r.float(), torch.tensor(float("inf"))).double() - r)
    good = cand[(p - r) >= 0.25 * ulp]
    if good.numel() < rows:
        raise RuntimeError("adversarial_scores: too few candidates; try another seed")
    xmax = good[:rows]
    x = (torch.rand(rows, cols, generator=g) * 2 - 1) * lo * 0.999  # every other entry below the max
    col = torch.randint(0, cols, (rows,), generator=g)
    x[torch.arange(rows), col] = xmax
    return x.to(device)
