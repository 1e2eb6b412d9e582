"""Cast checks: every quantize kernel of every recipe against the oracle, bit for bit.

Expected results are computed here from the definitions alone (``lowbit/scaling/scales.py``'s
docstring, docs/design.md), independently of ``lowbit.scaling``'s code: block amax over finite |x| in
float64, the scale rule evaluated in exact rationals and rounded once to fp32 (E8M0, UE4M3 where the
recipe says so), each element by ``oracle.quantize_exact``. Checked: every block scale (bit-equal,
NaN = NaN), every element (``ulp_distance`` in the element format: 0 required, zeros with the same
sign), delayed scaling's state update, and both outputs of ``quantize_fp8_t``. NV gradients are
stochastically rounded: an element passes when it is one of the two neighbours of x / scale.

Large tensors (GPU runs) are checked against the oracle on a sample (every adversarial row and
random positions, ``ORACLE_MAX`` elements) and against the torch reference
(``FP8Tensor.from_float``, itself checked exhaustively against the oracle in CI) on every element.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Optional

import torch

from ..dtypes import E2M1, E4M3, FP4Tensor, FP8Tensor
from ..dtypes.formats import FP32, Format
from ..scaling import MX, NV, Blockwise, Current, Delayed, DelayedScalingState, Rowwise
from .inputs import CAST_KINDS, cast_input
from .kernel_checks import AuditConfig, CheckResult, failed_row
from .metrics import ulp_distance
from .oracle import quantize_exact, round_to_format

__all__ = ["CAST_CASES", "run", "expected_scales", "ORACLE_MAX"]

ORACLE_MAX = 16384

# (label, recipe, role, api): api "fp8" = quantize_fp8, "fp8_t" = quantize_fp8_t, "fp4" = quantize_fp4
CAST_CASES = (
    ("fp8 (delayed)", Delayed(), "input", "fp8"),
    ("fp8-current", Current(), "input", "fp8"),
    ("fp8-current", Current(), "grad", "fp8"),
    ("fp8-rowwise", Rowwise(), "input", "fp8"),
    ("fp8-block", Blockwise(), "input", "fp8"),
    ("fp8-block", Blockwise(), "weight", "fp8"),
    ("mxfp8 (floor)", MX(elem="e4m3"), "input", "fp8"),
    ("mxfp8 (rceil)", MX(elem="e4m3", scale_rule="rceil"), "input", "fp8"),
    ("fp8 (delayed)", Delayed(), "grad", "fp8_t"),
    ("fp8-current", Current(), "input", "fp8_t"),
    ("fp8-rowwise", Rowwise(), "grad", "fp8_t"),
    ("fp8-block", Blockwise(), "weight", "fp8_t"),
    ("mxfp8 (rceil)", MX(elem="e4m3", scale_rule="rceil"), "input", "fp8_t"),
    ("mxfp4", MX(elem="e2m1"), "input", "fp4"),
    ("nvfp4", NV(), "input", "fp4"),
    ("nvfp4", NV(), "weight", "fp4"),
    ("nvfp4 (SR)", NV(), "grad", "fp4"),
)
_KERNEL = {"fp8": "quantize_fp8", "fp8_t": "quantize_fp8_t", "fp4": "quantize_fp4"}


# ---- expected scales, from the definitions --------------------------------------------------------------
def _fp32(q: Fraction) -> float:
    return round_to_format(q, FP32, saturate=False)


def _blocks(x: torch.Tensor, br: int, bc: int):
    """x (R, C) float64 as (nR, nC, br*bc) blocks, zero-padded."""
    R, C = x.shape
    nR, nC = -(-R // br), -(-C // bc)
    p = torch.zeros(nR * br, nC * bc, dtype=torch.float64)
    p[:R, :C] = x
    return p.view(nR, br, nC, bc).permute(0, 2, 1, 3).reshape(nR, nC, br * bc)


def expected_scales(x: torch.Tensor, recipe, role: str):
    """(block scales (nR, nC) float64, element scales (R, C), NV global scale or None) of ``x``."""
    x = x.to(torch.float64).cpu()
    R, C = x.shape
    fmt = recipe.format(role)
    br, bc = recipe.granularity(role).sizes((R, C))
    blk = _blocks(x, br, bc)
    fin = torch.where(torch.isfinite(blk), blk.abs(), torch.zeros_like(blk))
    amax, has_nan = fin.amax(-1), torch.isnan(blk).any(-1)
    g = None
    if isinstance(recipe, NV):
        at = float(amax.max()) if amax.numel() else 0.0
        g = _fp32(Fraction(at) / Fraction(E4M3.max * E2M1.max)) if at > 0 else 1.0
        g = g if g > 0 else 1.0
        rule = lambda a: max(round_to_format(_fp32(Fraction(_fp32(Fraction(a) / 6)) / Fraction(g)), E4M3),  # noqa: E731
                             E4M3.min_subnormal)
    elif isinstance(recipe, MX):
        rule = lambda a: _mx_scale(a, fmt, recipe.scale_rule)  # noqa: E731
    else:
        rule = lambda a: _fp32(Fraction(a) / Fraction(fmt.max)) or 1.0  # noqa: E731  (0 when it underflows)
    zero = E4M3.min_subnormal if isinstance(recipe, NV) else 1.0  # an all-zero block's scale
    s = torch.tensor([[math.nan if has_nan[i, j] and isinstance(recipe, (MX, NV)) else (rule(float(amax[i, j]))
                       if amax[i, j] > 0 else zero) for j in range(amax.shape[1])] for i in range(amax.shape[0])],
                     dtype=torch.float64)
    eff = s if g is None else torch.tensor([[_fp32(Fraction(v) * Fraction(g)) if v == v else math.nan
                                             for v in row] for row in s.tolist()], dtype=torch.float64)
    elem = eff.repeat_interleave(br, 0)[:R].repeat_interleave(bc, 1)[:, :C]
    return s, elem, g


def _mx_scale(a: float, fmt: Format, rule: str) -> float:
    e = math.frexp(a)[1] - 1  # floor(log2 a)
    if rule == "floor":
        k = e - fmt.emax
    else:  # smallest k with fmax * 2^k >= a
        k = e - math.frexp(fmt.max)[1] + 1
        while Fraction(fmt.max) * Fraction(2) ** k < Fraction(a):
            k += 1
        while Fraction(fmt.max) * Fraction(2) ** (k - 1) >= Fraction(a):
            k -= 1
    return 2.0 ** min(max(k, -127), 127)


# ---- expected elements ------------------------------------------------------------------------------
def _positions(R: int, C: int, seed: int) -> Optional[torch.Tensor]:
    """Flat indices the oracle checks (None: all of them)."""
    if R * C <= ORACLE_MAX:
        return None
    g = torch.Generator().manual_seed(seed)
    head = torch.arange(min(R, 8) * C)
    rest = torch.randint(head.numel(), R * C, (ORACLE_MAX - head.numel(),), generator=g)
    return torch.unique(torch.cat([head, rest]))


def _expected(x: torch.Tensor, scale: torch.Tensor, fmt: Format, idx, stochastic: bool):
    """(lo, hi) expected float64 values at ``idx`` (equal unless stochastic: the two neighbours)."""
    xs = x.to(torch.float64).flatten().cpu()
    ss = scale.flatten()
    if idx is not None:
        xs, ss = xs[idx], ss[idx]
    lo, hi = [], []
    for v, s in zip(xs.tolist(), ss.tolist()):
        if v != v or s != s:  # NaN element or NaN-scale block: NaN (FP8) / code 0 (E2M1, no NaN)
            e = 0.0 if fmt is E2M1 else math.nan
            lo.append(e)
            hi.append(e)
        elif stochastic:
            lo.append(quantize_exact(v, s, fmt, "down"))
            hi.append(quantize_exact(v, s, fmt, "up"))
        else:
            q = quantize_exact(v, s, fmt)
            lo.append(q)
            hi.append(q)
    return torch.tensor(lo, dtype=torch.float64), torch.tensor(hi, dtype=torch.float64)


def _compare(vals: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, fmt: Format):
    """(max ULP, elements off, zeros of the wrong sign) of the kernel's values against the expected ones."""
    d = ulp_distance(vals, lo, fmt)
    if not torch.equal(lo, hi):
        d = torch.minimum(d, ulp_distance(vals, hi, fmt))
    zero = (vals == 0) & (lo == 0) & (hi == 0)
    signs = int((zero & (torch.signbit(vals) != torch.signbit(lo))).sum())
    return (float(d.max()) if d.numel() else 0.0), int((d > 0).sum()), signs


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> int:
    """Positions where two float64 tensors differ (NaN = NaN, -0 != +0)."""
    a, b = a.to(torch.float64).cpu().flatten(), b.to(torch.float64).cpu().flatten()
    same = (a == b) & (torch.signbit(a) == torch.signbit(b)) | (torch.isnan(a) & torch.isnan(b))
    return int((~same).sum())


# ---- one quantized output against expectations -------------------------------------------------------------
def _values(t) -> tuple:
    """(element values float64 (R, C), block scales float64, global scale or None) of a lowbit tensor."""
    if isinstance(t, FP4Tensor):
        return (E2M1.decode(t.codes()).to(torch.float64).cpu(), t.block_scale_fp32().to(torch.float64).cpu(),
                float(t._global_scale))
    return t._data.to(torch.float64).cpu(), t.scale_fp32().to(torch.float64).cpu().reshape(-1), None


def _check_one(t, x: torch.Tensor, recipe, role: str, seed: int, memo: dict, scale_override=None) -> tuple:
    """(max ULP, problems: list of str) of one quantized tensor ``t`` of ``x`` (``memo``: the expected
    scales and elements per input, shared by the backends)."""
    fmt = recipe.format(role)
    problems = []
    vals, scales, g = _values(t)
    if tuple(vals.shape) != tuple(x.shape):
        return math.inf, [f"shape {tuple(vals.shape)}, expected {tuple(x.shape)}"]
    key = (x.data_ptr(), tuple(x.shape), scale_override)
    if key not in memo:
        if scale_override is not None:  # delayed scaling: the state's scale, one for the tensor
            s_blocks = torch.tensor([[scale_override]], dtype=torch.float64)
            s_elem, g_exp = torch.full(tuple(x.shape), scale_override, dtype=torch.float64), None
        else:
            s_blocks, s_elem, g_exp = expected_scales(x, recipe, role)
        stochastic = isinstance(recipe, NV) and recipe.sr_grads and role == "grad"
        idx = _positions(*x.shape, seed)
        memo[key] = (s_blocks, g_exp, idx, *_expected(x, s_elem, fmt, idx, stochastic))
    s_blocks, g_exp, idx, lo, hi = memo[key]
    bad_scales = _same_bits(scales.reshape(-1), s_blocks.reshape(-1)) if scales.numel() == s_blocks.numel() \
        else s_blocks.numel()
    if bad_scales:
        problems.append(f"{bad_scales} of {s_blocks.numel()} block scales differ")
    if g_exp is not None and not (g == g_exp):
        problems.append(f"global scale {g!r}, expected {g_exp!r}")
    flat = vals.flatten() if idx is None else vals.flatten()[idx]
    ulp, off, signs = _compare(flat, lo, hi, fmt)
    if off:
        problems.append(f"{off} element(s) off the oracle")
    if signs:
        problems.append(f"{signs} zero(s) of the wrong sign")
    return ulp, problems


def _reference(x, recipe, role, api, state):
    if api == "fp4":
        return FP4Tensor.from_float(x, recipe, role)
    q = FP8Tensor.from_float(x, recipe, role, state=state)
    return (q, FP8Tensor.from_float(x.t().contiguous(), recipe, role)) if api == "fp8_t" else q


def _cast_fn(backend: str, api: str):
    """The cast to audit: the backend's fused cast (None if it has none), or the public API for "torch"."""
    from ..kernels import BACKENDS, quantize_fp4, quantize_fp8, quantize_fp8_t
    if backend == "torch":
        return {"fp8": lambda x, r, role, st: quantize_fp8(x, r, role, st, backend="torch"),
                "fp8_t": lambda x, r, role, st: quantize_fp8_t(x, r, role, st, backend="torch"),
                "fp4": lambda x, r, role, st: quantize_fp4(x, r, role, backend="torch")}[api]
    be = BACKENDS.get(backend)
    hook = getattr(be, {"fp8": "quantize_fp8", "fp8_t": "quantize_fp8_t", "fp4": "quantize_fp4"}[api])
    if hook is None:
        return None
    if api == "fp4":
        return lambda x, r, role, st: hook(x, r, role, None, None)
    return hook


def _run_case(label, recipe, role, api, backend, x, kind, dtype, config, memo) -> CheckResult:
    fmt = recipe.format(role)
    name = f"{label} {fmt.name} {role}"
    shape = "x".join(map(str, x.shape))
    inputs = kind if dtype == torch.float32 else f"{kind} ({str(dtype).replace('torch.', '')})"
    kernel = _KERNEL[api]
    xd = x.to(config.device)
    fn = _cast_fn(backend, api)
    if fn is None:
        return CheckResult(kernel, backend, name, shape, inputs, "max ULP", math.inf, 0, False,
                           "backend has no fused cast")
    try:
        delayed = isinstance(recipe, Delayed)
        state = DelayedScalingState(recipe, fmt).to(config.device) if delayed else None
        calls = 2 if delayed else 1  # delayed: the first cast uses scale 1, the second the history's
        worst, problems = 0.0, []
        for call in range(calls):
            before = float(state.scale) if delayed else None
            out = fn(xd, recipe, role, state)
            if out is None:
                return CheckResult(kernel, backend, name, shape, inputs, "max ULP", math.inf, 0, False,
                                   "the kernel declined the call")
            outs = out if api == "fp8_t" else (out,)
            for j, t in enumerate(outs):
                xx = x if j == 0 else memo.setdefault(("t", x.data_ptr()), x.t().contiguous())
                ulp, p = _check_one(t, xx, recipe, role, config.seed, memo, before)
                worst = max(worst, ulp)
                problems += [f"{'q_t: ' if j else ''}{m}" for m in p]
            if delayed:
                amax = float(torch.where(torch.isfinite(x.double()), x.double().abs(), 0).max())
                want = _fp32(Fraction(amax) / Fraction(fmt.max)) if amax > 0 else before
                if float(state.scale) != want:
                    problems.append(f"delayed state scale {float(state.scale)!r} after the cast, expected {want!r}")
        if backend != "torch" and x.numel() > ORACLE_MAX:
            problems += _against_reference(out, xd, recipe, role, api)
    except Exception as e:  # noqa: BLE001 - a kernel that raises is a failed row
        return failed_row(kernel, backend, name, shape, inputs, "max ULP", 0, e)
    detail = "; ".join(problems) if problems else ("bit-exact: scales and elements" +
                                                    (" (sampled)" if x.numel() > ORACLE_MAX else ""))
    return CheckResult(kernel, backend, name, shape, inputs, "max ULP", worst, 0, not problems, detail)


def _against_reference(out, xd, recipe, role, api) -> list:
    """Every element against the torch reference (large tensors; delayed: its second cast)."""
    if isinstance(recipe, Delayed) or (isinstance(recipe, NV) and recipe.sr_grads and role == "grad"):
        return []
    ref = _reference(xd, recipe, role, api, None)
    outs, refs = (out, ref) if api == "fp8_t" else ((out,), (ref,))
    bad = sum(_same_bits(_values(o)[0], _values(r)[0]) for o, r in zip(outs, refs))
    return [f"{bad} element(s) differ from the torch reference"] if bad else []


def run(config: AuditConfig) -> list:
    """Every cast case x input kind x backend (module docstring); quick: the adversarial input, 8 x 256
    (one row of each kind), fp32."""
    shapes = [(8, 256)] if config.quick else [(8, 256), (256, 1024)]
    dtypes = [torch.float32] if config.quick else [torch.float32, torch.bfloat16]
    kinds = ("adversarial",) if config.quick else CAST_KINDS
    out = []
    for R, C in shapes:
        for label, recipe, role, api in CAST_CASES:
            for kind in kinds:
                for dtype in dtypes:
                    x = cast_input(kind, R, C, recipe.format(role), config.seed).to(dtype)
                    memo: dict = {}  # expected results of this input, shared by the backends
                    for backend in config.backends:
                        out.append(_run_case(label, recipe, role, api, backend, x, kind, dtype, config, memo))
    return out
