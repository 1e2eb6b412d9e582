"""FP8 attention for training: ``scaled_dot_product_attention``, a drop-in for torch's, and
``scaled_dot_product_attention_varlen`` for packed sequences, with their autograd Function.

``scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
scale=None, enable_gqa=False, *, window=None, recipe=None, backend="auto")`` takes torch's
arguments and layout ``(B, H, S, D)`` (or ``(H, S, D)``) and returns the output in the query's
dtype; gradients flow to query, key and value. The numbers: ``lowbit.scaling.attention``
(``AttentionRecipe``, default ``AttentionRecipe()``); the kernels: ``lowbit.kernels.attention``
(``backend``: "auto", "triton" or the exact emulation "torch").

``window``: an int W (``|i - j| < W``; with ``is_causal`` the W most recent keys, self included,
as Hugging Face's ``sliding_window``) or ``(left, right)`` (``i - left <= j <= i + right``, None
for an unbounded side). ``is_causal`` is top-left aligned (torch's ``tril``).

What is not computed in FP8, and what happens instead:

* errors, as torch itself would raise them: a non-tensor argument, different dtypes or devices,
  shapes that do not match (batch, sequence of key and value, head dim of query and key, heads
  of key and value), query heads not a multiple of key heads, or GQA without ``enable_gqa``;
  a malformed ``window`` or ``recipe``;
* one warning per reason (Python's default filter shows it once per call site) and torch's
  ``scaled_dot_product_attention`` in the input dtype: an ``attn_mask`` (only ``is_causal`` and
  ``window`` are fused), ``dropout_p > 0``, head dims other than multiples of 16 up to 256,
  float64 inputs, a CUDA GPU below sm_90 (the kernels use TMA and FP8 wgmma), inputs of other ranks;
  empty inputs go to torch without a warning.

Under ``torch.compile`` the FP8 call is a graph break: it runs eagerly (its kernels launch from
Python), the code around it is compiled.
"""
from __future__ import annotations

import math
import warnings
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F

from ..kernels.attention import attention_backward, attention_forward, attention_support, select_backend
from ..kernels.attention_emulation import visible
from ..kernels.triton.runtime import capability
from ..scaling.attention import AttentionRecipe

__all__ = ["scaled_dot_product_attention", "scaled_dot_product_attention_varlen", "normalize_window"]

Window = Union[None, int, Tuple[Optional[int], Optional[int]]]


class _FP8Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen, causal, window, scale, recipe, backend):
        out, lse, used = attention_forward(q, k, v, causal=causal, window=window, scale=scale, recipe=recipe,
                                           backend=backend, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
        ctx.save_for_backward(q, k, v, out)
        ctx.lse, ctx.cu_seqlens = lse, cu_seqlens  # lse: the backend's residual (a tensor or a list)
        ctx.meta = (max_seqlen, causal, window, scale, recipe, used)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out = ctx.saved_tensors
        max_seqlen, causal, window, scale, recipe, used = ctx.meta
        dq, dk, dv = attention_backward(dout, q, k, v, out, ctx.lse, causal=causal, window=window, scale=scale,
                                        recipe=recipe, backend=used, cu_seqlens=ctx.cu_seqlens,
                                        max_seqlen=max_seqlen)
        return dq, dk, dv, None, None, None, None, None, None, None


def normalize_window(window: Window) -> Tuple[Optional[int], Optional[int]]:
    """``window`` as ``(left, right)`` (module docstring)."""
    if window is None:
        return None, None
    if isinstance(window, int) and not isinstance(window, bool):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        return window - 1, window - 1
    if isinstance(window, (tuple, list)) and len(window) == 2 and all(
            w is None or (isinstance(w, int) and not isinstance(w, bool) and w >= 0) for w in window):
        return tuple(window)
    raise ValueError(f"window must be None, an int >= 1 or a (left, right) pair of ints >= 0 / None, got {window!r}")


def _check(query, key, value, enable_gqa: bool, varlen: bool) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"scaled_dot_product_attention: {name} must be a tensor, got {type(t).__name__}")
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(f"scaled_dot_product_attention: query, key and value must have one dtype, got "
                        f"{query.dtype}, {key.dtype}, {value.dtype}")
    if not query.device == key.device == value.device:
        raise ValueError(f"scaled_dot_product_attention: query, key and value are on {query.device}, {key.device}, "
                         f"{value.device}")
    shapes = f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
    if not query.dim() == key.dim() == value.dim():
        raise ValueError(f"scaled_dot_product_attention: {shapes} have different ranks")
    head, seq = (-2, -3) if varlen else (-3, -2)
    if query.dim() >= 3 and (query.shape[:head] != key.shape[:head] or key.shape[:head] != value.shape[:head]
                             or key.shape[seq] != value.shape[seq] or query.shape[-1] != key.shape[-1]
                             or key.shape[head] != value.shape[head] or (varlen and query.shape[0] != key.shape[0])):
        raise ValueError(f"scaled_dot_product_attention: {shapes} do not match (batch, key/value length and "
                         "heads, query/key head dim)")
    if query.dim() >= 3:
        hq, hkv = query.shape[head], key.shape[head]
        if hq % max(hkv, 1):
            raise ValueError(f"scaled_dot_product_attention: {hq} query heads are not a multiple of {hkv} key heads")
        if hq != hkv and not enable_gqa:
            raise ValueError(f"scaled_dot_product_attention: {hq} query heads and {hkv} key heads need "
                             "enable_gqa=True")


def _fallback_reason(query, key, value, attn_mask, dropout_p) -> Optional[str]:
    """Why this call runs on torch's SDPA instead (None: it runs in FP8)."""
    if attn_mask is not None:
        return "an attn_mask is given (lowbit fuses is_causal and window only)"
    if dropout_p > 0:
        return "dropout_p > 0 (lowbit's FP8 attention has no dropout)"
    if query.dim() not in (3, 4):
        return f"inputs of rank {query.dim()} (lowbit takes (B, H, S, D) and (H, S, D))"
    why = attention_support(query, key, value)
    if why:
        return why
    if query.device.type == "cuda" and capability(query.device) < (9, 0):
        return "lowbit's attention kernels need sm_90+ (TMA, FP8 wgmma)"
    return None


def _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, window):
    """torch's SDPA, with the window (and the causal mask it must then combine with) as a bool mask."""
    if window != (None, None):
        vis = visible(query.shape[-2], key.shape[-2], is_causal, window, query.device)
        attn_mask = vis if attn_mask is None else (attn_mask & vis if attn_mask.dtype == torch.bool
                                                   else attn_mask.masked_fill(~vis, float("-inf")))
        is_causal = False
    kw = {"enable_gqa": True} if enable_gqa else {}
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale, **kw)


def _recipe(recipe) -> AttentionRecipe:
    if recipe is None:
        return AttentionRecipe()
    if not isinstance(recipe, AttentionRecipe):
        raise TypeError(f"recipe must be a lowbit.scaling.AttentionRecipe, got {recipe!r}")
    return recipe


@torch.compiler.disable  # the kernels launch from Python: under torch.compile this call is a graph break
def _run(q, k, v, cu, max_seqlen, causal, window, scale, recipe, backend):
    backend = select_backend(backend, q)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _FP8Attention.apply(q, k, v, cu, max_seqlen, causal, window, scale, recipe, backend)
    return attention_forward(q, k, v, causal=causal, window=window, scale=scale, recipe=recipe, backend=backend,
                             cu_seqlens=cu, max_seqlen=max_seqlen)[0]


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: Optional[float] = None, enable_gqa: bool = False, *, window: Window = None,
                                 recipe: Optional[AttentionRecipe] = None, backend: str = "auto") -> torch.Tensor:
    """FP8 ``softmax(q k^T * scale + mask) v`` (module docstring)."""
    _check(query, key, value, enable_gqa, varlen=False)
    win = normalize_window(window)
    recipe = _recipe(recipe)
    why = _fallback_reason(query, key, value, attn_mask, dropout_p)
    if why is None and min(query.numel(), key.numel()) == 0:
        return _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, win)
    if why is not None:
        warnings.warn(f"lowbit scaled_dot_product_attention: {why}; using torch's scaled_dot_product_attention",
                      stacklevel=2)
        return _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, win)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    if query.dim() == 3:
        out = _run(query[None], key[None], value[None], None, None, is_causal, win, scale, recipe, backend)
        return out[0]
    return _run(query, key, value, None, None, is_causal, win, scale, recipe, backend)


def scaled_dot_product_attention_varlen(query, key, value, cu_seqlens: torch.Tensor, max_seqlen: Optional[int] = None,
                                        *, is_causal: bool = False, scale: Optional[float] = None,
                                        window: Window = None, recipe: Optional[AttentionRecipe] = None,
                                        backend: str = "auto") -> torch.Tensor:
    """FP8 attention over packed sequences: ``query`` ``(T, Hq, D)``, ``key``/``value`` ``(T, Hkv, D)``
    (GQA when ``Hq > Hkv``), ``cu_seqlens`` int ``(nseq + 1,)`` token offsets (0 first, T last) shared by
    queries and keys, ``max_seqlen`` the longest sequence (read from ``cu_seqlens`` when None, a host
    sync). Each sequence attends only to itself. Shapes or dtypes the FP8 path can't take raise."""
    _check(query, key, value, True, varlen=True)
    if query.dim() != 3:
        raise ValueError(f"scaled_dot_product_attention_varlen takes (T, H, D) tensors, got {tuple(query.shape)}")
    why = attention_support(query, key, value)
    if why is not None:
        raise ValueError(f"scaled_dot_product_attention_varlen: {why}")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 \
            or cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.device != query.device:
        raise ValueError("cu_seqlens must be a 1-D int32/int64 tensor of nseq + 1 offsets on the query's device")
    if max_seqlen is None:
        max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    return _run(query, key, value, cu_seqlens, int(max_seqlen), is_causal, normalize_window(window), scale,
                _recipe(recipe), backend)
