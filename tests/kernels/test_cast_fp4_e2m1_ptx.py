"""The CUDA E2M1 pair encode (PTX of ``lowbit.kernels.triton.cast_fp4.e2m1.E2M1_PAIR_ASM``), executed
instruction by instruction in numpy, against the torch reference ``lowbit.dtypes.quantize``:
bit-exact for every bf16 bit pattern in each half of the word, times every MX factor ``2^-k`` the
kernel passes (k = -127 .. 125: a normal bf16), and codes 0 in blocks holding NaN. The fp32
encoder the other backends run (``_e2m1_rne``) is checked on a sample of [0, 6] dense near the
grid's points and midpoints.

The emulator's bf16 arithmetic is IEEE round-to-nearest-even with subnormals, computed exactly in
float64 (a product of two bf16 values is exact there; a sum of ``a <= 6`` and a power of two
``m <= 2^8`` is exact unless ``a < 2^-44``, where both roundings return m), as sm_90's HMUL2.BF16 /
HADD2.BF16 without .ftz; ``min`` returns the non-NaN operand. The GPU benchmark checks the kernel
end to end, NaN / inf / subnormal blocks and every bf16 pattern included."""
import numpy as np
import pytest
import torch

from lowbit.dtypes.quantize import quantize
from lowbit.kernels.triton.cast_fp4 import e2m1 as enc

U32 = np.uint32


def _bf16_to_f64(h):
    with np.errstate(invalid="ignore"):
        return ((h & U32(0xFFFF)) << U32(16)).view(np.float32).astype(np.float64)


def _f64_to_bf16(v):
    """bf16 bits of float64 ``v`` rounded to nearest even (subnormals, overflow -> inf, NaN -> 0x7FC0)."""
    with np.errstate(all="ignore"):
        a = np.abs(v)
        _, ex = np.frexp(a)
        q = np.maximum(ex.astype(np.int64) - 8, -133)  # quantum: 8 significant bits, 2^-133 at least
        r = np.ldexp(np.round(np.ldexp(a, -q)), q)
        r = np.where(r >= 2.0 ** 128, np.inf, r)
        bits = (r.astype(np.float32).view(U32) >> U32(16)) | (np.signbit(v).astype(U32) << U32(15))
    return np.where(np.isnan(v), U32(0x7FC0), bits).astype(U32)


def _halves(f, a, b):
    lo = f(_bf16_to_f64(a), _bf16_to_f64(b))
    hi = f(_bf16_to_f64(a >> U32(16)), _bf16_to_f64(b >> U32(16)))
    return _f64_to_bf16(lo) | (_f64_to_bf16(hi) << U32(16))


def _min(x, y):
    return np.where(np.isnan(x), y, np.where(np.isnan(y), x, np.minimum(x, y)))


def _max_u16x2(a, b):
    lo = np.maximum(a & U32(0xFFFF), b & U32(0xFFFF))
    return lo | (np.maximum(a >> U32(16), b >> U32(16)) << U32(16))


_OPS = {
    "mov.b32": lambda a: a,
    "and.b32": lambda a, b: a & b,
    "or.b32": lambda a, b: a | b,
    "shr.b32": lambda a, b: a >> b,
    "shl.b32": lambda a, b: a << b,
    "add.u32": lambda a, b: a + b,
    "sub.u32": lambda a, b: a - b,
    "max.u16x2": _max_u16x2,
    "mul.rn.bf16x2": lambda a, b: _halves(lambda x, y: x * y, a, b),
    "add.rn.bf16x2": lambda a, b: _halves(lambda x, y: x + y, a, b),
    "min.bf16x2": lambda a, b: _halves(_min, a, b),
}


def run_ptx(asm: str, regs: dict) -> dict:
    """Execute straight-line PTX on uint32 numpy arrays (``_OPS``; wrap-around 32-bit integers)."""
    env, names = dict(regs), set()
    for stmt in asm.replace("{", "").replace("}", "").split(";"):
        stmt = stmt.strip()
        if not stmt:
            continue
        op, rest = stmt.split(None, 1)
        args = [x.strip() for x in rest.split(",")]
        if op == ".reg":
            names |= set(args[0].split()[1:]) | set(args[1:])
            continue
        assert op in _OPS, f"unexpected PTX instruction {op}"
        src = [env[a] if a.startswith("$") or a in names else U32(int(a, 0)) for a in args[1:]]
        with np.errstate(over="ignore"):
            env[args[0]] = np.asarray(_OPS[op](*src), dtype=U32)
    return env


def _reference_codes(x_bits: np.ndarray, k: int) -> np.ndarray:
    """E2M1 codes of the bf16 patterns ``x_bits`` with the MX scale 2^k (the torch reference)."""
    x = torch.from_numpy((x_bits.astype(np.int32) << 16).view(np.float32).copy())
    return quantize(x, "e2m1", torch.tensor(2.0 ** k)).numpy().astype(U32)


@pytest.mark.parametrize("ks", [range(-127, -40), range(-40, 40), range(40, 126)])
def test_pair_encode_every_pattern_and_scale(ks):
    """Every bf16 pattern in the low half (the high half a permutation of all patterns), every
    factor 2^-k: both nibbles equal the reference's codes wherever the element is not NaN."""
    lo = np.arange(65536, dtype=U32)
    hi = np.random.default_rng(0).permutation(65536).astype(U32)
    w = lo | (hi << U32(16))
    lo_nan = np.isnan(_bf16_to_f64(lo))
    hi_nan = np.isnan(_bf16_to_f64(hi))
    ones = np.full_like(w, 0x7FFF7FFF)
    signs = np.full_like(w, 0x00080008)
    for k in ks:
        p = U32(((127 - k) << 7) * 65537)
        out = run_ptx(enc.E2M1_PAIR_ASM.value, {"$1": w, "$2": np.full_like(w, p), "$3": ones, "$4": signs})["$0"]
        got_lo, got_hi = out & U32(15), (out >> U32(4)) & U32(15)
        want_lo, want_hi = _reference_codes(lo, k), _reference_codes(hi, k)
        bad = ~lo_nan & (got_lo != want_lo)
        assert not bad.any(), (k, hex(int(lo[bad][0])), int(got_lo[bad][0]), int(want_lo[bad][0]))
        bad = ~hi_nan & (got_hi != want_hi)
        assert not bad.any(), (k, hex(int(hi[bad][0])), int(got_hi[bad][0]), int(want_hi[bad][0]))


def test_pair_encode_nan_block_gives_zero_codes():
    """With the NaN-block masks (0, 0) every pattern encodes to the byte 0."""
    w = np.arange(65536, dtype=U32) | (np.random.default_rng(1).permutation(65536).astype(U32) << U32(16))
    zero = np.zeros_like(w)
    for k in (-127, 0, 125):
        out = run_ptx(enc.E2M1_PAIR_ASM.value,
                      {"$1": w, "$2": np.full_like(w, ((127 - k) << 7) * 65537), "$3": zero, "$4": zero})["$0"]
        assert not (out & U32(0xFF)).any(), k


def test_fp32_encode_sampled_and_near_the_grid():
    """``_e2m1_rne``'s int32 arithmetic (in numpy, as the kernel computes it) against the
    reference's codes on fp32 in [0, 6]: every 4096th bit pattern, and every pattern within 4096
    ulps of each grid point and midpoint (all 1.09e9 patterns agreed in a one-off numpy run of
    ~70 s, too long for the suite)."""
    end = int(np.float32(6.0).view(U32))
    near = np.concatenate([np.float32(v).view(U32) + np.arange(-4096, 4097, dtype=np.int64)
                           for v in (0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6)])
    bits = np.unique(np.concatenate([np.arange(0, end + 1, 4096), near, [end]])).astype(np.int64)
    bits = bits[(bits >= 0) & (bits <= end)].astype(U32)
    a = bits.view(np.float32)
    with np.errstate(over="ignore"):
        v = np.maximum((bits.view(np.int32) >> 23) + np.int32(enc._E2M1_V0.value), np.int32(127 + enc._E2M1_V0.value))
        t = a + ((v << 23) + np.int32(enc._E2M1_M0.value)).view(np.float32)
        got = t.view(np.int32) + v * np.int32(-8388606)
    want = quantize(torch.from_numpy(a.copy()), "e2m1", torch.tensor(1.0)).numpy().astype(np.int32)
    assert np.array_equal(got, want)
