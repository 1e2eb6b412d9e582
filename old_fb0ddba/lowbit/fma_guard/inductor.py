"""Scan the Triton kernels that torch.compile (inductor) generates for a user function.

``inductor_kernels(fn, *example_inputs)`` runs ``torch.compile(fn, backend="inductor")`` once and
captures every Triton kernel source inductor hands to its compiler, without compiling or running
it (``AsyncCompile.triton`` is patched for the duration). With CPU inputs inductor is told to emit
Triton for the CPU (``cpu_backend="triton"``) and, having no GPU driver, is given a stand-in backend
hash; with CUDA inputs it generates its usual CUDA kernels. Each source is written to a file (JIT
functions need one), imported, and the ``@triton.jit`` function, its signature (``triton_meta``),
pointer alignment and first heuristic config (block sizes, ``num_warps``) are kept.
``scan_inductor`` compiles each for sm_90 and scans it.

What differs on a CPU-only machine: inductor picks tilings and configs for the CPU device, so the
block sizes may differ from what it would pick on an H100; the arithmetic, and so the contraction
pattern, is the same source. Only the first config of each kernel is scanned.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import os
import tempfile
import warnings
from unittest import mock

__all__ = ["InductorKernel", "inductor_kernels", "scan_inductor"]


@dataclasses.dataclass(frozen=True)
class InductorKernel:
    name: str
    path: str
    kernel: object          # the CachingAutotuner (``.fn`` is the JITFunction)
    signature: dict
    constexprs: dict
    attrs: dict
    num_warps: int


class _Captured:
    def __getattr__(self, item):
        raise RuntimeError("lowbit.fma_guard: kernel captured for scanning, not compiled")


def _capture_sources(fn, example_inputs) -> list[tuple[str, str]]:
    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor.async_compile import AsyncCompile

    captured: list[tuple[str, str]] = []

    def fake_triton(self, kernel_name, source_code, device_str="cuda"):
        captured.append((kernel_name, source_code))
        return _Captured()

    patches = {"fx_graph_cache": False, "compile_threads": 1}
    on_cpu = not any(isinstance(a, torch.Tensor) and a.is_cuda for a in example_inputs)
    if on_cpu:
        patches["cpu_backend"] = "triton"
    torch._dynamo.reset()
    try:
        with inductor_config.patch(patches), mock.patch.object(AsyncCompile, "triton", fake_triton), \
                (mock.patch("torch.utils._triton.triton_hash_with_backend", lambda: "LOWBIT-FMA-GUARD-SCAN")
                 if on_cpu else contextlib.nullcontext()):
            try:
                torch.compile(fn, backend="inductor")(*example_inputs)
            except Exception:  # the captured kernels cannot run; the sources are all we need
                if not captured:
                    raise
    finally:
        torch._dynamo.reset()
    return captured


def inductor_kernels(fn, *example_inputs, out_dir: str | None = None) -> list[InductorKernel]:
    """The Triton kernels inductor generates for ``fn(*example_inputs)``.

    Each source is kept as a file (in ``out_dir``, default a per-content folder under the temp dir):
    findings point at its lines."""
    sources = _capture_sources(fn, example_inputs)
    if not sources:
        raise RuntimeError("inductor generated no Triton kernel for this function (nothing to scan)")
    out = []
    for name, src in sources:
        # a path fixed by the content: Triton's compile cache keeps the PTX (and its .file paths) per source
        where = out_dir or os.path.join(tempfile.gettempdir(), "lowbit_fma_inductor",
                                        hashlib.sha256(src.encode()).hexdigest()[:16])
        os.makedirs(where, exist_ok=True)
        path = os.path.join(where, f"{name}.py")
        with open(path, "w") as f:
            f.write(src)
        spec = importlib.util.spec_from_file_location(f"lowbit_fma_inductor_{name}", path)
        mod = importlib.util.module_from_spec(spec)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Could not find an active CPU backend"
            spec.loader.exec_module(mod)
        tuner = getattr(mod, name)
        meta = tuner.triton_meta
        sig = {k: v for k, v in meta["signature"].items() if v != "constexpr"}
        cfg = tuner.configs[0] if getattr(tuner, "configs", None) else None
        cx = dict(meta.get("constants", {}))
        cx.update(dict(getattr(cfg, "kwargs", {}) or {}))
        cx = {k: v for k, v in cx.items() if k in meta["signature"]}
        attrs = (meta.get("configs") or [{}])[0]
        out.append(InductorKernel(name=name, path=path, kernel=tuner, signature=sig, constexprs=cx,
                                  attrs=attrs if isinstance(attrs, dict) else {},
                                  num_warps=int(getattr(cfg, "num_warps", 4) or 4)))
    return out


def scan_inductor(fn, *example_inputs, target="sm_90", enable_fp_fusion=True, out_dir: str | None = None):
    """``Report`` for each Triton kernel inductor generates for ``fn(*example_inputs)``."""
    from .compile import compile_kernel
    from .scan import scan_ptx
    reports = []
    for k in inductor_kernels(fn, *example_inputs, out_dir=out_dir):
        asm = compile_kernel(k.kernel, k.signature, k.constexprs, target=target, enable_fp_fusion=enable_fp_fusion,
                             num_warps=k.num_warps, attrs=k.attrs or None)
        reports.append(scan_ptx(asm.ptx, kernel=k.name, llir=asm.llir, target=asm.target,
                                enable_fp_fusion=enable_fp_fusion))
    return reports
