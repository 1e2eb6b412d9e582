"""``lowbit audit hardware``: the tensor cores' accumulator, measured with crafted dot products.

A probe takes ``mm(A, B) -> C``: a GEMM of float tensors A (M, K), B (K, N) whose values the
operand format holds exactly, returning fp32 (every probe reads ``C[0, 0]``; all rows and columns
are the same). Products of powers of two are exact, so the exact answer of every probe is known.

* ``probe_bits(mm, fmt, K, far)``: products ``2^h`` and ``2^(h-k)`` (the small one right after the
  big one, or ``far``: at the end of K, past the first MMA step): the small one survives the
  alignment to the big one while ``k < bits``; ``bits`` = the first ``k`` it is lost at (RNE at
  ``bits`` bits loses ``2^(h - bits)``: a tie to even), counting the leading bit. The fp32 output
  shows at most 24, so 24 means "at least 24". Then the rounding: ``1.5 * 2^(h - bits)`` (0.75 of
  the last kept bit) comes out rounded up under round-to-nearest and dropped under truncation.
* ``probe_promotion(mm, fmt, K)``: ``2^h`` first, then ``K - 1`` products ``e = 2^(h-22)``: inside
  a tensor core that keeps fewer than 17 bits every group of up to 128 of them is below half a
  unit of the big running sum and vanishes, but a 128-chunk of them started from zero and added in
  fp32 (a promotion) is exact. So ``survivors = (C - 2^h) / e`` small products survive and the
  kernel promotes every ``P = K - survivors`` products (the chunk holding the big one loses its
  ``P - 1``); ``P = K``: never within K (``interval`` None); no product lost: the accumulator keeps
  them all and promotion cannot be seen.

``audit_hardware()`` runs them on the GPU (FP8 E4M3 through lowbit's GEMMs and cuBLAS
``torch._scaled_mm``, bf16 through cuBLAS ``torch.mm(..., out_dtype=float32)``) and returns a
``HardwareAudit`` (``format()``, ``to_dict()``); without a CUDA GPU it raises ``NoGPU``.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Callable, Optional

import torch

from ..dtypes.formats import BF16, E4M3, Format

__all__ = ["probe_bits", "probe_promotion", "audit_hardware", "HardwareAudit", "ProbeResult", "NoGPU",
           "PROMOTION_GAP"]

PROMOTION_GAP = 22  # the small products of probe_promotion are 2^-22 of the big one
_M = _N = 128  # 128 rows: scaled_mm takes its production (Gluon) path on sm_90 where it applies


class NoGPU(RuntimeError):
    """``audit_hardware`` needs a CUDA GPU."""


def _split(e: int, fmt: Format) -> tuple:
    """(ea, eb) with ea + eb = e, both normal exponents of ``fmt``; ValueError if none exist."""
    ea = -(-e // 2)
    eb = e - ea
    if not (fmt.emin <= eb <= ea <= fmt.emax):
        raise ValueError(f"2^{e} is not a product of two normal {fmt.name} values")
    return ea, eb


def _operands(K: int, terms: list) -> tuple:
    """A (M, K), B (K, N) float32 with ``A[:, k] * B[k, :] = v`` for each ``(k, (a, b))``."""
    A, B = torch.zeros(_M, K), torch.zeros(K, _N)
    for k, (a, b) in terms:
        A[:, k], B[k, :] = a, b
    return A, B


def _pair(e: int, fmt: Format, mant: float = 1.0) -> tuple:
    ea, eb = _split(e, fmt)
    return mant * 2.0 ** ea, 2.0 ** eb


def _read(C: torch.Tensor) -> float:
    c = C.detach().float().cpu()
    if not bool((c == c[0, 0]).all()):
        raise ArithmeticError("the probe's outputs differ between rows/columns (a kernel that is not row-uniform)")
    return float(c[0, 0])


def _big(fmt: Format) -> int:
    """Exponent of the big product: the largest even one both factors reach."""
    return 2 * min(fmt.emax, 8 if fmt.ebits <= 5 else 30)


def probe_bits(mm: Callable, fmt: Format, K: int = 32, far: bool = False) -> dict:
    """{"bits", "rounding", "at_least"} of ``mm`` (module docstring)."""
    h = _big(fmt)
    pos = K - 1 if far else 1
    k_max = min(h - 2 * fmt.emin, 40)
    bits = None
    for k in range(1, k_max + 1):
        r = _read(mm(*_operands(K, [(0, _pair(h, fmt)), (pos, _pair(h - k, fmt))])))
        if r == 2.0 ** h + 2.0 ** (h - k):
            continue
        if r != 2.0 ** h:
            raise ArithmeticError(f"probe_bits: 2^{h} + 2^{h - k} came out as {r!r}")
        bits = k
        break
    at_least = bits is None or bits >= 24
    if bits is None:
        bits = k_max + 1
    rounding = None
    if not at_least:
        r = _read(mm(*_operands(K, [(0, _pair(h, fmt)), (pos, _pair(h - bits, fmt, 1.5))])))
        rounding = {2.0 ** h: "truncation", 2.0 ** h + 2.0 ** (h - bits + 1): "nearest"}.get(r, f"other ({r!r})")
    return {"bits": min(bits, 24), "rounding": rounding, "at_least": at_least}


def probe_promotion(mm: Callable, fmt: Format, K: int = 4096) -> dict:
    """{"interval", "survivors", "lost"} of ``mm`` (module docstring); interval None: no promotion
    within K; "survivors" == K - 1: nothing lost, promotion unobservable."""
    h = 16
    small = _pair(h - PROMOTION_GAP, fmt)
    A, B = _operands(K, [(0, _pair(h, fmt))])
    A[:, 1:], B[1:, :] = small[0], small[1]
    r = _read(mm(A, B))
    eps = 2.0 ** (h - PROMOTION_GAP)
    survivors = (r - 2.0 ** h) / eps
    if survivors != int(survivors) or not 0 <= survivors <= K - 1:
        raise ArithmeticError(f"probe_promotion: 2^{h} + {K - 1} x 2^{h - PROMOTION_GAP} came out as {r!r}")
    survivors = int(survivors)
    interval = None if survivors == 0 else K - survivors
    return {"interval": interval, "survivors": survivors, "lost": (K - 1 - survivors) * eps, "K": K}


# ---- the GPU audit ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ProbeResult:
    probe: str       # "bits" | "promotion"
    kernel: str
    format: str
    K: int
    value: Optional[float]
    detail: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class HardwareAudit:
    device: str
    capability: str
    results: tuple

    def to_dict(self) -> dict:
        return {"device": self.device, "capability": self.capability, "probes": [r.to_dict() for r in self.results]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def format(self) -> str:
        cols = ("probe", "kernel", "format", "K", "result", "detail")
        rows = [(r.probe, r.kernel, r.format, str(r.K), _show(r), r.detail) for r in self.results]
        widths = [max(len(c), *(len(x[i]) for x in rows)) if rows else len(c) for i, c in enumerate(cols)]
        lines = [f"{self.device} (sm_{self.capability.replace('.', '')})",
                 "  ".join(c.ljust(w) for c, w in zip(cols, widths))]
        return "\n".join(lines + ["  ".join(v.ljust(w) for v, w in zip(x, widths)) for x in rows])


def _show(r: ProbeResult) -> str:
    if r.value is None:
        return "never" if r.probe == "promotion" and "error" not in r.detail else "-"
    return f"{r.value:g} bits" if r.probe == "bits" else f"every {r.value:g}"


def _fp8(x: torch.Tensor):
    return x.to(torch.float8_e4m3fn)


def _kernels(device) -> dict:
    """name -> (format, mm) of the GEMMs probed."""
    from ..dtypes import FP8Tensor
    from ..kernels import scaled_mm
    from ..scaling import Block
    one = torch.ones((), device=device)

    def lowbit(fast: bool, blockwise: bool = False):
        def mm(A, B):
            a, b = _fp8(A.to(device)), _fp8(B.t().contiguous().to(device))  # b: the (N, K) weight
            K = A.shape[1]
            if blockwise:
                qa = FP8Tensor(a, torch.ones(_M, -(-K // 128), device=device), Block(1, 128))
                qb = FP8Tensor(b, torch.ones(1, -(-K // 128), device=device), Block(128, 128)).t()
            else:
                qa, qb = FP8Tensor(a, one), FP8Tensor(b, one).t()
            return scaled_mm(qa, qb, torch.float32, backend="triton", fast_accum=fast)
        return mm

    def cublas(fast: bool):
        def mm(A, B):
            a, b = _fp8(A.to(device)), _fp8(B.t().contiguous().to(device)).t()  # column-major B
            return torch._scaled_mm(a, b, one, one, out_dtype=torch.float32, use_fast_accum=fast)
        return mm

    def bf16(A, B):
        return torch.mm(A.to(device, torch.bfloat16), B.to(device, torch.bfloat16), out_dtype=torch.float32)

    return {"cuBLAS _scaled_mm fast_accum": (E4M3, cublas(True)), "cuBLAS _scaled_mm": (E4M3, cublas(False)),
            "lowbit tensorwise fast_accum": (E4M3, lowbit(True)), "lowbit tensorwise": (E4M3, lowbit(False)),
            "lowbit blockwise": (E4M3, lowbit(False, True)), "cuBLAS torch.mm bf16": (BF16, bf16)}


_BITS_ON = ("cuBLAS _scaled_mm fast_accum", "lowbit tensorwise fast_accum", "cuBLAS torch.mm bf16")
_PROMOTION_ON = ("lowbit tensorwise", "lowbit tensorwise fast_accum", "lowbit blockwise", "cuBLAS _scaled_mm",
                 "cuBLAS _scaled_mm fast_accum")


def audit_hardware(device=None, K_promotion: int = 4096) -> HardwareAudit:
    """Run the probes on a CUDA GPU (module docstring); a probe that fails is a row naming the error."""
    if not torch.cuda.is_available():
        raise NoGPU("no CUDA GPU: lowbit audit hardware measures a GPU's tensor cores")
    device = torch.device(device or "cuda")
    major, minor = torch.cuda.get_device_capability(device)
    kernels = _kernels(device)
    rows = []
    for name in _BITS_ON:
        fmt, mm = kernels[name]
        for K, far in ((32, False), (256, True)):
            where = "small product in a later MMA step" if far else "both products in one MMA step"
            rows.append(_guard(lambda: _bits_row(name, fmt, mm, K, far, where), "bits", name, fmt, K))
    for name in _PROMOTION_ON:
        fmt, mm = kernels[name]
        rows.append(_guard(lambda: _promotion_row(name, fmt, mm, K_promotion), "promotion", name, fmt, K_promotion))
    return HardwareAudit(torch.cuda.get_device_name(device), f"{major}.{minor}", tuple(rows))


def _bits_row(name, fmt, mm, K, far, where) -> ProbeResult:
    r = probe_bits(mm, fmt, K, far)
    detail = where + (f"; rounding: {r['rounding']}" if r["rounding"] else "")
    if r["at_least"]:
        detail += "; at least this many (the fp32 output's precision)"
    return ProbeResult("bits", name, fmt.name, K, float(r["bits"]), detail)


def _promotion_row(name, fmt, mm, K) -> ProbeResult:
    r = probe_promotion(mm, fmt, K)
    if r["survivors"] == K - 1:
        return ProbeResult("promotion", name, fmt.name, K, None, "no product lost: promotion cannot be seen")
    detail = f"{r['survivors']} of {K - 1} small products kept, {r['lost']:g} lost of 2^16"
    return ProbeResult("promotion", name, fmt.name, K, None if r["interval"] is None else float(r["interval"]),
                       detail)


def _guard(fn, probe, name, fmt, K) -> ProbeResult:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a kernel that cannot run this probe is reported, not fatal
        return ProbeResult(probe, name, fmt.name, K, None, f"error: {type(e).__name__}: {str(e)[:160]}")
