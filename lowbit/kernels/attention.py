"""FP8 attention, backend neutral: ``attention_forward`` / ``attention_backward`` on the Triton
kernels (``lowbit.kernels.triton.attention``) or the exact torch emulation
(``attention_emulation``), which computes the same numbers on any device.

Backends: ``"triton"`` (CUDA sm_90+; CPU tensors under ``TRITON_INTERPRET=1``), ``"torch"`` (the
emulation: float64 scores, O(S^2) memory, meant for checking and small CPU runs) and ``"auto"``
(Triton on a capable GPU, else the emulation). ``attention_support`` says which shapes and dtypes
the FP8 path takes at all; callers fall back to high-precision attention for the rest.

Shapes: dense ``(B, H, S, D)`` (any strides; K and V may have fewer heads, ``Hq % Hkv == 0``) or
packed ``(T, H, D)`` with ``cu_seqlens`` (int32, ``nseq + 1`` offsets shared by queries and keys)
and ``max_seqlen``. ``window = (left, right)``: key j is visible from query i when
``i - left <= j <= i + right`` (None: unbounded), intersected with ``j <= i`` when causal
(top-left aligned, as ``torch.nn.functional.scaled_dot_product_attention``). The ``lse`` a forward
returns is the backend's own (opaque) residual for its backward. ``accumulator`` (the "torch"
backend only): sum the FP8 products as a tensor core does (``attention_emulation``), e.g.
``lowbit.validate.metrics.HOPPER_FP8`` to compute what the kernels compute on an H100/H200.
"""
from __future__ import annotations

from importlib.util import find_spec
from typing import Optional, Tuple

import torch

from ..scaling.attention import AttentionRecipe
from .attention_emulation import emulated_backward, emulated_forward
from .triton.attention.tuning import kernel_tiles
from .triton.runtime import capability, interpreting

__all__ = ["attention_forward", "attention_backward", "attention_support", "select_backend", "HEAD_DIMS",
           "ATTENTION_BACKENDS"]

ATTENTION_BACKENDS = ("auto", "torch", "triton")
MAX_HEAD_DIM = 256
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
HEAD_DIMS = "multiples of 16 up to 256 (64, 128, 256 and 192 with 128 for V among them)"


def attention_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Optional[str]:
    """None when the FP8 attention takes these head dims and dtypes, else why not."""
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.dtype not in FLOAT_DTYPES:
            return f"{name} is {t.dtype}; FP8 attention takes float16, bfloat16 or float32"
    for name, d in (("query/key", q.shape[-1]), ("value", v.shape[-1])):
        if d % 16 or not 16 <= d <= MAX_HEAD_DIM:
            return f"{name} head dim {d}: FP8 attention takes {HEAD_DIMS}"
    return None


def select_backend(backend: str, q: torch.Tensor) -> str:
    """``"torch"`` or ``"triton"`` for this call (``backend``: one of ATTENTION_BACKENDS)."""
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {backend!r}")
    if backend == "auto":
        ok = find_spec("triton") is not None and q.device.type == "cuda" and capability(q.device) >= (9, 0)
        return "triton" if ok else "torch"
    if backend == "triton":
        if find_spec("triton") is None:
            raise RuntimeError("attention backend 'triton' needs triton installed")
        from .triton.attention.launch import triton_support
        why = triton_support(q)
        if why is not None:
            raise ValueError(f"attention backend 'triton' cannot run here: {why}")
    return backend


def _check_accumulator(accumulator, backend: str) -> None:
    if accumulator is not None and backend != "torch":
        raise ValueError(f"accumulator= models the tensor cores in the 'torch' backend; the {backend!r} backend "
                         f"sums on the hardware")


def _sequences(cu_seqlens: torch.Tensor, *tensors):
    """Per packed sequence: the (1, H, L, D) views of each (T, H, D) tensor."""
    cu = cu_seqlens.tolist()
    for a, b in zip(cu[:-1], cu[1:]):
        yield [t[a:b].transpose(0, 1)[None] for t in tensors]


def _unpack(parts, like: torch.Tensor) -> torch.Tensor:
    return torch.cat([p[0].transpose(0, 1) for p in parts], 0) if parts else like.new_empty(like.shape)


def attention_forward(q, k, v, *, causal: bool = False, window: Tuple[Optional[int], Optional[int]] = (None, None),
                      scale: float, recipe: AttentionRecipe, backend: str = "auto",
                      cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None,
                      accumulator=None):
    """(out in q's dtype, lse residual, backend used) of FP8 attention (module docstring)."""
    backend = select_backend(backend, q)
    _check_accumulator(accumulator, backend)
    if backend == "triton":
        from .triton.attention.launch import attention_fwd
        out, lse = attention_fwd(q, k, v, causal=causal, window=window, scale=scale, recipe=recipe,
                                 cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
        return out, lse, backend
    block_n = kernel_tiles(q.shape[-1], recipe, interpreting())[0]
    kw = dict(causal=causal, window=window, scale=scale, recipe=recipe, block_n=block_n, accumulator=accumulator)
    if cu_seqlens is None:
        out, lse = emulated_forward(q, k, v, **kw)
        return out, lse, backend
    parts = [emulated_forward(*t, **kw) for t in _sequences(cu_seqlens, q, k, v)]
    return _unpack([p[0] for p in parts], q[..., :v.shape[-1]]), [p[1] for p in parts], backend


def attention_backward(dout, q, k, v, out, lse, *, causal: bool = False,
                       window: Tuple[Optional[int], Optional[int]] = (None, None), scale: float,
                       recipe: AttentionRecipe, backend: str, cu_seqlens: Optional[torch.Tensor] = None,
                       max_seqlen: Optional[int] = None, accumulator=None):
    """(dq, dk, dv) for the ``lse`` residual of ``attention_forward`` on the same ``backend``."""
    _check_accumulator(accumulator, backend)
    if backend == "triton":
        from .triton.attention.launch import attention_bwd
        return attention_bwd(dout, q, k, v, out, lse, causal=causal, window=window, scale=scale, recipe=recipe,
                             cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
    _, block_m, block_n = kernel_tiles(q.shape[-1], recipe, interpreting())
    kw = dict(causal=causal, window=window, scale=scale, recipe=recipe, block_m=block_m, block_n=block_n,
              accumulator=accumulator)
    if cu_seqlens is None:
        return emulated_backward(q, k, v, out, lse, dout, **kw)
    grads = [emulated_backward(q_, k_, v_, o_, l_, d_, **kw)
             for (q_, k_, v_, o_, d_), l_ in zip(_sequences(cu_seqlens, q, k, v, out, dout), lse)]
    return tuple(_unpack([g[i] for g in grads], t) for i, t in enumerate((q, k, v)))
