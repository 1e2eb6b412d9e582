"""Launcher of the FP8 GEMMs: ``FP8Gemm.plan(a, b, out_dtype, bias, fast_accum)`` for FP8Tensors
a ``(M, K)``, b ``(K, N)``: a plan to run, or why the kernels can't take the call.

One pass: the plan is made once per (operand and scale shapes, strides, dtypes, blocks, 16-byte
alignment, out dtype, bias layout, fast_accum, device) and holds the support verdict (the only
check), the scale geometry, the kernel (``tuning.kernel``: the warp-specialized Gluon kernel for
promoting GEMMs of >= ``gluon_min_m`` rows on sm_90, else the TMA kernel for K-major operands on
sm_90+, else the pointer kernel), its configuration, its tensor descriptors (created once, their
base tensor replaced per call) and its ``runtime.Launch``.

``fast_accum``: no promotion for tensorwise and rowwise scales; K-scaled GEMMs (blockwise, MX)
promote every chunk whatever it says.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton

from ..runtime import Launch, capability, cdiv, interpreting, runnable, sm_count, store_dtype
from . import gluon_ws as _ws
from . import kernels as _k
from .tuning import GEMM_FP8_TUNING, GemmFP8Tuning, chunk_of

__all__ = ["FP8Gemm", "scale_geometry", "triton_kernel"]

try:  # host-side TMA descriptors (triton >= 3.4)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton
    TensorDescriptor = None

_KEY = ["M", "N", "K", "SA_ROWS", "SA_K", "SB_K", "SB_COLS", "K_SCALED", "PROMOTE", "E8M0", "HAS_BIAS"]


def _extent(v: int, full: int) -> int:
    """Block extent for the kernel: 0 when one scale spans the whole dim."""
    return 0 if v == -1 or v >= full else v


def scale_geometry(a, b):
    """Scale geometry of ``a @ b`` as the kernels take it, or a string saying why they can't:
    ``dict(SA_ROWS, SA_K, SB_K, SB_COLS, K_SCALED, E8M0)`` (0 = one scale along that dim)."""
    M, K = a.shape
    N = b.shape[1]
    e8 = (a._scale.dtype == torch.float8_e8m0fnu, b._scale.dtype == torch.float8_e8m0fnu)
    if e8[0] != e8[1]:
        return "one operand has E8M0 (MX) scales and the other fp32 scales"
    ra, ka = a.block.sizes(a.shape) if not a.block.is_tensorwise else (-1, -1)
    kb, cb = b.block.sizes(b.shape) if not b.block.is_tensorwise else (-1, -1)
    geo = dict(SA_ROWS=_extent(ra if a.block.rows != -1 else -1, M),
               SA_K=_extent(ka if a.block.cols != -1 else -1, K),
               SB_K=_extent(kb if b.block.rows != -1 else -1, K),
               SB_COLS=_extent(cb if b.block.cols != -1 else -1, N), E8M0=e8[0])
    chunk = chunk_of(geo["SA_K"], geo["SB_K"])
    if chunk % 32:
        return "K-scale blocks whose common chunk is not a multiple of 32 elements"
    geo["K_SCALED"] = chunk != 0
    return geo


def _ws_mode(geo) -> Optional[str]:
    """The Gluon kernel's mode: tensorwise, rowwise, blockwise (1x128 x 128x128), blockwise_cols
    (1x128 x 128x1: wgrad's operands, both quantized along the tokens), or None."""
    if geo["E8M0"]:
        return None
    return {(0, 0, 0, 0): "tensorwise", (1, 0, 0, 1): "rowwise", (1, 128, 128, 128): "blockwise",
            (1, 128, 128, 1): "blockwise_cols"}.get((geo["SA_ROWS"], geo["SA_K"], geo["SB_K"], geo["SB_COLS"]))


def _scale_args(t):
    s = t._scale
    if s.dtype == torch.float8_e8m0fnu:
        s = s.view(torch.uint8)
    return (s, 0, 0) if s.dim() == 0 else (s, s.stride(-2), s.stride(-1))


def _tma_ok(qa: torch.Tensor, qb: torch.Tensor) -> bool:
    """TMA: K-major A (M, K) and B (K, N) (i.e. B^T row-major), 16-byte aligned rows."""
    return (TensorDescriptor is not None and qa.stride(1) == 1 and qb.stride(0) == 1 and qa.stride(0) % 16 == 0
            and qb.stride(1) % 16 == 0 and qa.data_ptr() % 16 == 0 and qb.data_ptr() % 16 == 0)


def triton_kernel(device, qa, qb, kernel: str = "auto") -> str:
    """Which plain-Triton kernel runs: ``"tma"`` on sm_90+ for K-major operands, else
    ``"pointer"``; ``kernel`` (``tuning.kernel``) "tma" / "pointer" forces one."""
    if kernel in ("tma", "pointer"):
        return kernel
    return "tma" if device.type == "cuda" and capability(device)[0] >= 9 and _tma_ok(qa, qb) else "pointer"


def _release(*descs) -> None:
    """Drop a plan's TMA descriptors' hold on the operands of the call just launched (the launch has
    read their addresses). A plan outlives its calls: a descriptor still holding an operand would
    keep it allocated until the next call (memory a step never frees), and inside a CUDA graph's
    pool it is an allocation the graph does not track (cudagraph trees refuse to record)."""
    for d in descs:
        d.base = None


def _set_blocks(nargs):
    """TMA descriptors carry the tile shape: set it from the configuration being launched."""
    nargs["a_desc"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_K"]]
    nargs["b_desc"].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_K"]]


class FP8Gemm:
    """The FP8 GEMMs of one backend: its tuning table, autotuners and plan cache."""

    def __init__(self, tuning: GemmFP8Tuning = GEMM_FP8_TUNING):
        self.tuning = tuning
        self._plans: dict = {}
        self.ptr_tuned = self._tuner(_k._scaled_mm_kernel, "pointer")
        self.tma_tuned = self._tuner(_k._scaled_mm_tma_kernel, "tma")

    # ---- autotuning -------------------------------------------------------------------------
    def _cfg(self, kind, bm, bn, bk, warps, stages, persistent=0):
        """A ``triton.Config`` of ``kind`` ("pointer" or "tma") from a pool row."""
        kw = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": self.tuning.group_m}
        if kind != "pointer":
            kw["PERSISTENT"] = bool(persistent)
        return triton.Config(kw, num_warps=warps, num_stages=stages, pre_hook=None if kind == "pointer" else _set_blocks)

    def _tuner(self, kernel, kind):
        rows = self.tuning.all_rows()
        configs = [self._cfg(kind, *c) for c in dict.fromkeys(r[:5] if kind == "pointer" else r for r in rows)]

        def prune(configs, named_args, **kw):
            """The pool of this call; K-scaled needs BLOCK_K | chunk (an odd chunk, MX-32, gets
            BLOCK_K = gcd(chunk, 128))."""
            chunk = chunk_of(kw["SA_K"], kw["SB_K"]) if kw["K_SCALED"] else 0
            pool = self.tuning.pool(named_args["M"], bool(chunk or kw["PROMOTE"]))
            bk = math.gcd(chunk, 128) if chunk else None
            keep = {}
            for row in pool:
                cfg = (row[0], row[1], bk if chunk and chunk % row[2] else row[2], *row[3:])
                cfg = cfg[:5] if kind == "pointer" else cfg  # the pointer kernel has no `persistent`
                keep.setdefault(cfg, self._cfg(kind, *cfg))
            return list(keep.values())
        return triton.autotune(configs=configs, key=_KEY, prune_configs_by={"early_config_prune": prune})(kernel)

    def last_config(self) -> dict:
        """Configurations the autotuners chose, per kernel and tuning key (benchmark reports)."""
        from ..runtime import autotune_choices
        return autotune_choices({"pointer": self.ptr_tuned, "tma": self.tma_tuned})

    # ---- planning -----------------------------------------------------------------------------
    def plan(self, a, b, out_dtype, bias, fast_accum: bool):
        """A callable ``run(a, b, bias) -> C`` for these operands, or the reason they can't run
        (shape-independent words). ``a``, ``b``: FP8Tensors on one device (the backend checked)."""
        da, db, sa, sb = a._data, b._data, a._scale, b._scale
        key = (da.shape, da.stride(), da.dtype, db.shape, db.stride(), db.dtype, sa.shape, sa.stride(), sa.dtype,
               sb.shape, sb.stride(), sb.dtype, a._block, b._block, out_dtype, fast_accum, da.device,
               da.data_ptr() % 16 == 0, db.data_ptr() % 16 == 0,
               None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._make(a, b, out_dtype, bias, fast_accum)
        return plan

    def _make(self, a, b, out_dtype, bias, fast_accum):
        M, K = a.shape
        N = b.shape[1]
        if K < 16 or K % 16 or N % 16:
            return "FP8 GEMMs need K and N to be multiples of 16"
        geo = scale_geometry(a, b)
        if isinstance(geo, str):
            return geo
        if geo["K_SCALED"]:
            fast_accum = False  # K-scaled GEMMs promote every chunk whatever fast_accum says
        t = self.tuning
        dev = a.device
        promoting = geo["K_SCALED"] or not fast_accum
        if t.kernel in ("auto", "ws") and promoting and (M >= t.gluon_min_m or t.kernel == "ws") \
                and dev.type == "cuda" and not interpreting():
            run = self._ws(a, b, out_dtype, bias, geo)
            if run is not None:
                return run
        return self._triton(a, b, out_dtype, bias, geo, fast_accum)

    def _ws(self, a, b, out_dtype, bias, geo):
        """The warp-specialized Gluon kernel's plan, or None (declined)."""
        mode = _ws_mode(geo)
        if mode is None or _ws.ws_support(a._data, b._data, mode, out_dtype, bias) is not None:
            return None
        M, K = a.shape
        N = b.shape[1]
        sa, sb = a._scale, b._scale
        kc = -(-K // 128)
        if mode == "rowwise" and (sa.numel() != M or sb.numel() != N):
            return None
        if mode in ("tensorwise", "rowwise"):
            if sa.dtype != torch.float32 or sb.dtype != torch.float32:
                return None
        else:
            shapes = ((M, kc), (kc, N if mode == "blockwise_cols" else -(-N // 128)))
            if sa.dtype != torch.float32 or sb.dtype != torch.float32 or tuple(sa.shape) != shapes[0] \
                    or tuple(sb.shape) != shapes[1]:
                return None
        if sa.device != a.device or sb.device != a.device:
            return None
        cfg = self.tuning.ws_config(M, N, mode)
        ring = cfg.smem_scales and mode in ("blockwise", "blockwise_cols")
        qa, qb = a._data, b._data
        bt = qb.t()
        a_desc = _ws.GluonDesc(qa, list(qa.shape), [qa.stride(0), 1], [_ws.BM // 2, _ws.BK],
                               _ws.smem_layout(_ws.BM // 2, _ws.BK))
        b_desc = _ws.GluonDesc(bt, list(bt.shape), [bt.stride(0), 1], [cfg.block_n, _ws.BK],
                               _ws.smem_layout(cfg.block_n, _ws.BK))
        grid = (min(sm_count(a.device), -(-M // _ws.BM) * -(-N // cfg.block_n)),)
        launch = Launch(_ws._fp8_gemm_ws_kernel, grid, MODE=_ws.MODES[mode], HAS_BIAS=bias is not None,
                        STAGES=cfg.stages, SUBK=cfg.subk, GROUP_M=cfg.group_m, CONSUMER_REGS=cfg.consumer_regs,
                        PRODUCER_REGS=cfg.producer_regs, EPI_OVERLAP=cfg.epi_overlap, SMEM_SCALES=ring, num_warps=4,
                        maxnreg=cfg.maxnreg)
        dev = a.device

        def scale_desc(rows):
            return _ws.GluonDesc(rows, list(rows.shape), [rows.stride(0), 1], [1, 128], _ws.row_layout())

        def run(a, b, bias):
            a_desc.base, b_desc.base = a._data, b._data.t()
            sa, sb = a._scale, b._scale
            sa_desc, sb_desc = a_desc, b_desc  # stand-ins, unused unless the scale ring is
            if mode == "tensorwise":
                sa, sb = sa.reshape(1, 1), sb.reshape(1, 1)
            elif mode == "rowwise":
                sa, sb = sa.reshape(M, 1), sb.reshape(1, N)
            elif ring:  # a chunk's scales a coalesced run, loaded by TMA into the ring
                sa_rows = _ws.chunk_rows(sa.t())  # (chunks, M): sA[m, c] at c * stride + m
                sa_desc, sa = scale_desc(sa_rows), sa_rows.t()
                if mode == "blockwise_cols":
                    sb = _ws.chunk_rows(sb)  # sB[c, n] at c * stride + n
                    sb_desc = scale_desc(sb)
            else:
                sa = sa.t().contiguous().t()
                if mode == "blockwise_cols":
                    sb = sb.contiguous()
            out = torch.empty((M, N), dtype=out_dtype, device=dev)
            bias_t = bias.contiguous() if bias is not None else out
            launch(a_desc, b_desc, sa_desc, sb_desc, out, bias_t, sa, sb, M, N, K, out.stride(0), out.stride(1),
                   sa.stride(0), sa.stride(1), sb.stride(0), sb.stride(1))
            _release(a_desc, b_desc)
            return out
        return run

    def _triton(self, a, b, out_dtype, bias, geo, fast_accum):
        """The plain-Triton kernels' plan: TMA on sm_90+ for K-major operands, else pointers."""
        M, K = a.shape
        N = b.shape[1]
        qa, qb = a._data, b._data
        dev = a.device
        kind = triton_kernel(dev, qa, qb, self.tuning.kernel)
        if kind == "tma" and not _tma_ok(qa, qb):
            return "the TMA kernel needs K-major, 16-byte aligned operands"
        consts = dict(geo, PROMOTE=not fast_accum, HAS_BIAS=bias is not None)
        interp = interpreting()
        sdt = store_dtype(out_dtype)
        _, sam, sak = _scale_args(a)
        _, sbk, sbn = _scale_args(b)
        chunk = chunk_of(geo["SA_K"], geo["SB_K"]) if geo["K_SCALED"] else 0
        small = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": math.gcd(chunk, 128) if chunk else 64, "GROUP_M": 2}
        if kind == "pointer":
            launch = Launch(self.ptr_tuned, lambda meta: (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]),),
                            **consts, **(small if interp else {}))
            if interp:
                launch.grid = (cdiv(M, 32) * cdiv(N, 32),)

            def run(a, b, bias):
                c = torch.empty((M, N), dtype=sdt, device=dev)
                if M == 0 or N == 0:
                    return c.to(out_dtype)
                qa, qb = a._data, b._data
                s_a, s_b = _scale_args(a)[0], _scale_args(b)[0]
                launch(qa, qb, c, bias.contiguous() if bias is not None else c, s_a, s_b, M, N, K, qa.stride(0),
                       qa.stride(1), qb.stride(0), qb.stride(1), c.stride(0), c.stride(1), sam, sak, sbk, sbn)
                return c.to(out_dtype)
            return run
        nsm = sm_count(dev) if dev.type == "cuda" else 3  # 3 under the interpreter: programs walk several tiles
        cfg = dict(small, PERSISTENT=True) if interp else {}
        bm, bn, bk = (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]) if interp else (128, 128, 128)
        a_desc = TensorDescriptor(qa, [M, K], [qa.stride(0), 1], [bm, bk])
        b_desc = TensorDescriptor(qb.t(), [N, K], [qb.stride(1), 1], [bn, bk])

        def grid(meta):
            tiles = cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])
            return (min(nsm, tiles) if meta["PERSISTENT"] else tiles,)
        state = {"launch": Launch(self.tma_tuned, grid, **consts, **cfg)}
        if interp:
            state["launch"].grid = grid(cfg)

        def run(a, b, bias):
            c = torch.empty((M, N), dtype=sdt, device=dev)
            if M == 0 or N == 0:
                return c.to(out_dtype)
            a_desc.base, b_desc.base = a._data, b._data.t()
            s_a, s_b = _scale_args(a)[0], _scale_args(b)[0]
            args = (a_desc, b_desc, c, bias.contiguous() if bias is not None else c, s_a, s_b, M, N, K, c.stride(0),
                    c.stride(1), sam, sak, sbk, sbn)
            state["launch"](*args)
            _release(a_desc, b_desc)
            if "tuned" not in state and not interp:  # the autotuner chose: launch that config directly
                best = self.tma_tuned.best_config
                a_desc.block_shape = [best.kwargs["BLOCK_M"], best.kwargs["BLOCK_K"]]
                b_desc.block_shape = [best.kwargs["BLOCK_N"], best.kwargs["BLOCK_K"]]
                state["launch"] = Launch(runnable(self.tma_tuned).fn, grid, **consts, **best.all_kwargs())
                state["tuned"] = True
            return c.to(out_dtype)
        return run
