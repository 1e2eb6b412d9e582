"""Launcher of the FP4 GEMMs: ``FP4Gemm.plan(a, b, out_dtype, bias)`` for FP4Tensor x FP4Tensor
(NV x NV or MX x MX, ``mm``) and plain bf16/fp16 activations x FP4 weight (``weight_only``): a
plan to run, or why the kernels can't take the call. One plan per (operand and scale shapes,
strides, dtypes, blocks, kinds, out dtype, bias layout, device), holding the support verdict,
the launches and the split-K tile counters (one buffer per device, owned by this object).
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch
import triton
import triton.language as tl

from ....dtypes.fp4_tensor import FP4Tensor
from ..runtime import Launch, autotune_choices, capability, cdiv, interpreting, next_pow2, store_dtype
from . import mm as _mm
from . import weight_only as _wo
from .tuning import GEMM_FP4_TUNING, GemmFP4Tuning

__all__ = ["FP4Gemm", "fp4_layout_reason"]

_MAXNREG = "maxnreg" in inspect.signature(triton.Config).parameters


def fp4_layout_reason(t, name: str) -> Optional[str]:
    """None when ``t`` is an FP4 operand the kernels take as ``name`` ("a": packed along K as
    activations; "b": a transposed weight), else why not."""
    if not isinstance(t, FP4Tensor):
        return f"{name} is a {type(t).__name__}, not an FP4Tensor"
    if t.dim() != 2:
        return f"{name} must be 2-D"
    want_t = name == "b"
    if t._transposed != want_t:
        return f"FP4 operand {name} must be packed along K ({'weight.t()' if want_t else 'activations'})"
    rows, cols = t._block.rows, t._block.cols
    if t.kind == "nv" and (cols != 16 or rows not in (1, 16)):
        return "NV blocks must be 1x16 or 16x16 along K"
    if t.kind == "mx" and (rows != 1 or cols not in (32, 64, 128)):
        return "MX blocks must be 1 x 32, 64 or 128 along K"
    return None


def _kn_reason(a, b) -> Optional[str]:
    K, N = a.shape[1], b.shape[1]
    if K % 32 or N % 16 or K < 32:
        return "FP4 GEMMs need K to be a multiple of 32 and N of 16"
    return None


def _storage(t):
    """(packed words (R, K/8) int32, block scale bytes (R/rows, K/cols), block rows, block cols),
    in storage orientation (along K)."""
    q, s = t._qdata, t._scale.view(torch.uint8)  # E8M0 / UE4M3 bytes, decoded in the kernel
    if q.stride(-1) != 1 or q.stride(0) % 4 or q.data_ptr() % 4:
        q = q.contiguous()
    if s.stride(-1) != 1:
        s = s.contiguous()
    return q.view(torch.int32), s, t._block.rows, t._block.cols


def _want_bm(M: int) -> int:
    return 16 if M <= 16 else 32 if M <= 32 else 64 if M <= 64 else 128


class TileCounters:
    """The split-K tile counters, one int32 buffer per device, zero between launches (every launch
    leaves them zero). Allocated (zeroed) on first use outside a CUDA-graph capture; first used
    inside a capture, a buffer of that capture only (its zeroing is a memset node of the graph).
    Shared by the launches on one device: two of these GEMMs running *concurrently* on two
    streams would race."""

    def __init__(self):
        self.buffers: dict = {}

    def get(self, device, n: int) -> torch.Tensor:
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        buf = self.buffers.get(str(device))
        if buf is None or buf.numel() < n:
            buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
            if not capturing:
                self.buffers[str(device)] = buf
        return buf


class FP4Gemm:
    """The FP4 GEMMs of one backend: tuning table, autotuners, tile counters and plans."""

    def __init__(self, tuning: GemmFP4Tuning = GEMM_FP4_TUNING):
        self.tuning = tuning
        self.counters = TileCounters()
        self._plans: dict = {}
        t = tuning
        mm_cfgs = [triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8), num_warps=w, num_stages=s)
                   for w, s, bm, bn, bk in t.mm_configs]
        even_k = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
        self.mm_tuned = triton.autotune(mm_cfgs, key=["M", "N", "K", "SBLOCK", "SA_ROWS", "SB_ROWS", "MX", "HAS_BIAS",
                                                      "ASM"],
                                        prune_configs_by={"early_config_prune": _prune_mn})(even_k(_mm._fp4_mm_kernel))
        self.wo_configs = [self._wo_cfg(*c) for c in t.wo_configs]
        heur = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0,
                                  "PIPE_SCALES": lambda args: _wo.pipe_scales(args["BLOCK_N"], args["BLOCK_K"],
                                                                              args["SBLOCK"], args.get("num_warps", 4))})
        self.wo_tuned = triton.autotune(self.wo_configs, key=["M", "N", "K", "SBLOCK", "SROWS", "MX", "HAS_BIAS", "ASM"],
                                        prune_configs_by={"early_config_prune": self._prune_wo})(heur(_wo._wo_kernel))

    @staticmethod
    def _wo_cfg(warps, stages, bn, bm, bk, split, maxnreg=None):
        extra = {"maxnreg": maxnreg} if maxnreg and _MAXNREG else {}
        return triton.Config(dict(BLOCK_N=bn, BLOCK_M=bm, BLOCK_K=bk, SPLIT_K=split), num_warps=warps,
                             num_stages=stages, **extra)

    def _prune_wo(self, configs, named_args, **kw):
        """BLOCK_M: the smallest of 16 / 32 / 64 / 128 that covers M; BLOCK_K holds whole scale
        blocks; each split keeps >= 2 K steps; M <= 16: the decode tile alone where it fits."""
        M, K = named_args["M"], named_args["K"]
        sblock = kw.get("SBLOCK", named_args.get("SBLOCK", 16))  # constexprs come as keywords
        want = _want_bm(M)
        keep = [c for c in configs if c.kwargs["BLOCK_M"] == want and c.kwargs["BLOCK_K"] % sblock == 0
                and K >= 2 * c.kwargs["SPLIT_K"] * c.kwargs["BLOCK_K"]]
        w, s, bn, bm, bk, split = self.tuning.wo_decode_tile
        tile = [c for c in keep if (c.num_warps, c.num_stages, c.kwargs["BLOCK_N"], c.kwargs["BLOCK_M"],
                                    c.kwargs["BLOCK_K"], c.kwargs["SPLIT_K"]) == (w, s, bn, bm, bk, split)]
        if want == 16 and tile:
            return tile
        fw, fs, fbn, fbm, fbk, fsplit = self.tuning.wo_fallback
        return keep or [self._wo_cfg(fw, fs, fbn, min(want, fbm), max(fbk, sblock), fsplit)]

    def last_config(self) -> dict:
        """Configurations the autotuners chose, per kernel and (M, N, K)."""
        return autotune_choices({"fp4_mm": self.mm_tuned, "fp4_weight_only": self.wo_tuned})

    def _asm(self, device, dtype) -> bool:
        return self.tuning.ptx_decode and (not interpreting()) and device.type == "cuda" and dtype == torch.bfloat16 \
            and capability(device) >= (9, 0)

    @staticmethod
    def _dot_dtype(dtype):
        if interpreting():
            return tl.float32
        return tl.bfloat16 if dtype == torch.bfloat16 else tl.float16

    # ---- planning -----------------------------------------------------------------------------
    def plan(self, a, b, out_dtype, bias):
        """``run(a, b, bias) -> C`` or the reason the kernels can't take the call."""
        bq, bs = b._qdata, b._scale
        if isinstance(a, FP4Tensor):
            akey = ("fp4", a._qdata.shape, a._qdata.stride(), a._scale.shape, a._scale.stride(), a._block, a.kind,
                    a._transposed)
        else:
            akey = ("plain", a.shape, a.stride(), a.dtype)
        key = (akey, bq.shape, bq.stride(), bs.shape, bs.stride(), b._block, b.kind, b._transposed, out_dtype,
               a.device, None if bias is None else (bias.shape, bias.stride(), bias.dtype))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._make(a, b, out_dtype, bias)
        return plan

    def _make(self, a, b, out_dtype, bias):
        if isinstance(a, FP4Tensor):
            for t, name in ((a, "a"), (b, "b")):
                why = fp4_layout_reason(t, name)
                if why:
                    return why
            if a.kind != b.kind:
                return "FP4 operands of different kinds (NV x MX)"
            if a.kind == "mx" and a._block.cols != b._block.cols:
                return "MX operands with different block sizes"
            return _kn_reason(a, b) or self._mm(a, b, out_dtype, bias)
        why = fp4_layout_reason(b, "b")
        if why:
            return why
        if a.dtype not in (torch.bfloat16, torch.float16):
            return "weight-only FP4 GEMM takes bf16/fp16 activations"
        if a.dtype == torch.float16 and b.kind == "mx":
            return "MX weight-only GEMM takes bf16 activations (E8M0 scales exceed fp16's range)"
        return _kn_reason(a, b) or self._weight_only(a, b, out_dtype, bias)

    def _mm(self, a, b, out_dtype, bias):
        """FP4 x FP4 (``_fp4_mm_kernel``)."""
        M, K = a.shape
        N = b.shape[1]
        dev = a.device
        _, _, ra, _ = _storage(a)
        _, _, rb, blk = _storage(b)
        asm = self._asm(dev, torch.bfloat16)
        bk = max(64, blk)  # the interpreter's K tile
        interp = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=bk, GROUP_M=2, EVEN_K=K % bk == 0) if interpreting() else {}
        grid = (lambda meta: (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]),)) if not interp else \
            (cdiv(M, 32) * cdiv(N, 32),)
        launch = Launch(self.mm_tuned, grid, SBLOCK=blk, SA_ROWS=ra, SB_ROWS=rb, MX=a.kind == "mx",
                        HAS_BIAS=bias is not None, ASM=asm, DOT_DTYPE=self._dot_dtype(torch.bfloat16), **interp)
        sdt = store_dtype(out_dtype)

        def run(a, b, bias):
            c = torch.empty((M, N), dtype=sdt, device=dev)
            if M == 0 or N == 0:
                return c.to(out_dtype)
            qa, sa, _, _ = _storage(a)
            qb, sb, _, _ = _storage(b)
            launch(qa, qb, c, bias.contiguous() if bias is not None else c, sa, sb, a._global_scale, b._global_scale,
                   M, N, K, qa.stride(0), qb.stride(0), sa.stride(0), sb.stride(0), c.stride(0), c.stride(1))
            return c.to(out_dtype)
        return run

    def _weight_only(self, a, b, out_dtype, bias, config: Optional[dict] = None):
        """bf16/fp16 x FP4 weight (``_wo_kernel``); ``config``: one explicit configuration (the
        interpreter's, or a benchmark's A/B through ``_with_config``) instead of the autotuner."""
        out_dtype = out_dtype or a.dtype
        M, K = a.shape
        N = b.shape[1]
        dev = a.device
        _, _, rb, blk = _storage(b)
        asm = self._asm(dev, a.dtype)
        if interpreting() and config is None:
            config = dict(BLOCK_N=32, BLOCK_M=16, BLOCK_K=max(64, blk), SPLIT_K=2)
        if config is not None:
            fixed = dict(config)
            fixed["EVEN_K"] = K % fixed["BLOCK_K"] == 0
            fixed.setdefault("PIPE_SCALES", _wo.pipe_scales(fixed["BLOCK_N"], fixed["BLOCK_K"], blk,
                                                            fixed.get("num_warps", 4)))
            plans = [fixed]
            kernel = _wo._wo_kernel
        else:
            plans = [dict(cfg.kwargs) for cfg in self._prune_wo(self.wo_configs, {"M": M, "K": K}, SBLOCK=blk)]
            fixed, kernel = {}, self.wo_tuned
        # partials and counters sized for every configuration the launch may pick
        split = [p for p in plans if p["SPLIT_K"] > 1]
        part_n = max(cdiv(N, p["BLOCK_N"]) * p["BLOCK_N"] * cdiv(M, p["BLOCK_M"]) * p["BLOCK_M"] * p["SPLIT_K"]
                     for p in split) if split else 0
        n_locks = max(cdiv(N, p["BLOCK_N"]) * cdiv(M, p["BLOCK_M"]) for p in plans)
        grid = lambda meta: (cdiv(N, meta["BLOCK_N"]) * meta["SPLIT_K"], cdiv(M, meta["BLOCK_M"]))  # noqa: E731
        launch = Launch(kernel, grid(fixed) if config is not None else grid, SBLOCK=blk, SROWS=rb,
                        MX=b.kind == "mx", HAS_BIAS=bias is not None, ASM=asm,
                        DOT_DTYPE=self._dot_dtype(a.dtype), **fixed)
        sdt = store_dtype(out_dtype)

        def run(a, b, bias):
            c = torch.empty((M, N), dtype=sdt, device=dev)
            if M == 0 or N == 0:
                return c.to(out_dtype)
            x = a if a.stride(1) == 1 else a.contiguous()
            qb, sb, _, _ = _storage(b)
            part = torch.empty(max(part_n, 1), dtype=torch.float32, device=dev)
            locks = self.counters.get(dev, n_locks) if split else part
            launch(x, qb, sb, b._global_scale, c, part, locks, bias.contiguous() if bias is not None else c, M, N, K,
                   x.stride(0), qb.stride(0), sb.stride(0), c.stride(0), c.stride(1))
            return c.to(out_dtype)
        return run

    def _with_config(self, a, b, out_dtype, bias, config: dict):
        """Benchmarks' hook: the weight-only GEMM with one explicit configuration (keys BLOCK_N,
        BLOCK_M, BLOCK_K, SPLIT_K, PIPE_SCALES, num_warps, num_stages, maxnreg), unplanned."""
        why = self._make(a, b, out_dtype, bias)
        if isinstance(why, str):
            raise ValueError(f"fp4 weight-only GEMM: {why}")
        return self._weight_only(a, b, out_dtype, bias, config)(a, b, bias)


def _prune_mn(configs, named_args, **kw):
    """Tiles no larger than the problem (the smallest configuration always stays)."""
    M, N = named_args["M"], named_args["N"]
    keep = [c for c in configs if c.kwargs["BLOCK_M"] <= max(64, next_pow2(M))
            and c.kwargs["BLOCK_N"] <= max(64, next_pow2(N))]
    return keep or configs[-1:]
