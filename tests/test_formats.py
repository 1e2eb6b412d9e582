"""lowbit.formats: bit layouts, value sets, encode/decode, agreement with torch's float8 dtypes, CLI table."""
import dataclasses
import math

import pytest
import torch

from lowbit.cli import main as cli_main
from lowbit.dtypes.formats import BF16, E2M1, E4M3, E5M2, E8M0, FORMATS, FP16, FP32, UE4M3, get_format

SMALL = (E4M3, E5M2, E2M1, E8M0, UE4M3)
TORCH_8BIT = (E4M3, E5M2, E8M0)  # formats whose codes torch interprets itself


def all_codes(fmt):
    return torch.arange(1 << fmt.nbits, dtype=torch.int64)


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal as float64, NaN matching NaN and -0 distinct from +0."""
    a, b = a.double(), b.double()
    nan = torch.isnan(a)
    return (bool(torch.equal(nan, torch.isnan(b)))
            and bool(torch.equal(a[~nan], b[~nan]))
            and bool(torch.equal(torch.signbit(a[~nan]), torch.signbit(b[~nan]))))


def test_e2m1_values_exact():
    pos = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert E2M1.values().tolist() == pos + [-v for v in pos]  # code order: sign bit is bit 3
    assert torch.signbit(E2M1.values()[8])  # code 8 is -0
    assert (E2M1.max, E2M1.min_normal, E2M1.min_subnormal) == (6.0, 1.0, 0.5)
    assert E2M1.inf_code is None and E2M1.nan_code is None and E2M1.nbits == 4


@pytest.mark.parametrize("fmt,mx,mn,sub,n_finite", [
    (E4M3, 448.0, 2.0 ** -6, 2.0 ** -9, 254),
    (E5M2, 57344.0, 2.0 ** -14, 2.0 ** -16, 248),
    (E8M0, 2.0 ** 127, 2.0 ** -127, 2.0 ** -127, 255),
    (UE4M3, 448.0, 2.0 ** -6, 2.0 ** -9, 127),
    (FP16, 65504.0, 2.0 ** -14, 2.0 ** -24, 65536 - 2 * 1024),
    (BF16, float(torch.finfo(torch.bfloat16).max), 2.0 ** -126, 2.0 ** -133, 65536 - 2 * 128),
])
def test_extremes_and_value_count(fmt, mx, mn, sub, n_finite):
    assert (fmt.max, fmt.min_normal, fmt.min_subnormal) == (mx, mn, sub)
    v = fmt.values()
    assert v.dtype == torch.float64 and v.numel() == n_finite
    assert float(v.max()) == fmt.max and float(v[v > 0].min()) == fmt.min_subnormal
    assert float(v[v >= fmt.min_normal].min()) == fmt.min_normal


def test_fp32_extremes_match_finfo():
    fi = torch.finfo(torch.float32)
    assert (FP32.max, FP32.min_normal, FP32.min_subnormal) == (fi.max, fi.tiny, 2.0 ** -149)


@pytest.mark.parametrize("fmt", (E4M3, E5M2, E8M0, FP16, BF16))
def test_extremes_match_torch_finfo(fmt):
    fi = torch.finfo(fmt.torch_dtype)
    assert fmt.max == fi.max and fmt.min_normal == fi.smallest_normal
    if fmt.mbits:
        assert 2.0 ** -fmt.mbits == fi.eps


@pytest.mark.parametrize("fmt", (E4M3, E5M2, E8M0, FP16, BF16))
def test_decode_equals_torch_bit_interpretation(fmt):
    """Every code: our decode == torch viewing the same bits as its dtype (NaN, inf and -0 included)."""
    codes = all_codes(fmt)
    store = torch.uint8 if fmt.nbits == 8 else torch.int16
    theirs = codes.to(store).view(fmt.torch_dtype).to(torch.float64)
    assert same_values(fmt._table, theirs)
    if fmt.nbits == 8:
        assert same_values(fmt.decode(codes.to(torch.uint8)), theirs.float())


@pytest.mark.parametrize("fmt", TORCH_8BIT)
def test_encode_equals_torch_cast_of_representable_values(fmt):
    """Casting an exactly representable value is exact in torch, so its bits must be our code."""
    v = fmt.values()
    ours = fmt.encode(v)
    theirs = v.to(fmt.torch_dtype).view(torch.uint8)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("fmt", SMALL + (FP16, BF16))
def test_encode_decode_round_trip(fmt):
    codes = all_codes(fmt)
    vals = fmt._table
    finite = torch.isfinite(vals)
    # values -> codes -> values is the identity on every finite value (sign of zero kept)
    back = fmt._table[fmt.encode(vals[finite]).long()]
    assert same_values(back, vals[finite])
    # codes -> values -> codes is the identity on every finite code
    if fmt.nbits <= 8:
        assert torch.equal(fmt.encode(fmt.decode(codes[finite].to(torch.uint8))).long(), codes[finite])
    assert fmt.encode(vals[finite][:1]).dtype == (torch.uint8 if fmt.nbits <= 8 else torch.int64)
    # values() is the finite part of the table, in code order, strictly ordered by magnitude per sign
    assert same_values(fmt.values(), vals[finite])
    pos = vals[finite & ~torch.signbit(vals)]
    assert bool((pos[1:] > pos[:-1]).all())


@pytest.mark.parametrize("fmt", (E4M3, E5M2, FP16, BF16))
def test_special_codes(fmt):
    sign = 1 << (fmt.ebits + fmt.mbits)
    assert math.isnan(fmt.decode_code(fmt.nan_code)) and math.isnan(fmt.decode_code(fmt.nan_code | sign))
    nan_bits = fmt.encode(torch.tensor([float("nan"), -float("nan")]))
    assert nan_bits.tolist() == [fmt.nan_code] * 2
    if fmt.has_inf:
        assert fmt.decode_code(fmt.inf_code) == math.inf and fmt.decode_code(fmt.inf_code | sign) == -math.inf
    else:
        assert fmt.inf_code is None


def test_specials_match_torch():
    assert E4M3.nan_code == 0x7F and E4M3.inf_code is None
    assert E5M2.nan_code == 0x7E and E5M2.inf_code == 0x7C
    assert E8M0.nan_code == 0xFF and E8M0.decode_code(0) == 2.0 ** -127 and E8M0.decode_code(254) == 2.0 ** 127
    inf8 = torch.tensor([math.inf, -math.inf]).to(torch.float8_e5m2).view(torch.uint8)
    assert inf8.tolist() == [E5M2.inf_code, E5M2.inf_code | 0x80]
    for fmt in (E4M3, E5M2, E8M0):
        code = torch.tensor([fmt.nan_code], dtype=torch.uint8).view(fmt.torch_dtype)
        assert bool(torch.isnan(code.float()).all())


def test_e8m0_has_no_zero_and_ue4m3_no_sign():
    assert not E8M0.has_zero and not E8M0.signed and E8M0.emin == -127 and E8M0.emax == 127
    assert bool((E8M0.values() > 0).all())
    assert torch.equal(E8M0.values(), 2.0 ** torch.arange(-127, 128, dtype=torch.float64))
    assert UE4M3.nbits == 7 and bool((UE4M3.values() >= 0).all())  # 7 bits, stored in uint8
    assert torch.equal(UE4M3.values(), E4M3.values()[:127])  # the sign-0 half of E4M3, NaN dropped


def test_encode_rejects_non_representable_and_wrong_dtypes():
    with pytest.raises(ValueError, match="not representable"):
        E4M3.encode(torch.tensor([1.0, 1.0625]))
    with pytest.raises(ValueError, match="not representable"):
        E4M3.encode(torch.tensor([math.inf]))  # E4M3 has no inf
    with pytest.raises(ValueError, match="not representable"):
        E2M1.encode(torch.tensor([5.0]))
    with pytest.raises(ValueError, match="not representable"):
        E2M1.encode(torch.tensor([math.nan]))  # E2M1 has no NaN
    with pytest.raises(TypeError, match="int32"):
        E4M3.encode(torch.tensor([1], dtype=torch.int32))
    with pytest.raises(TypeError, match="float32"):
        E4M3.decode(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="0..15"):
        E2M1.decode(torch.tensor([16], dtype=torch.uint8))
    with pytest.raises(ValueError):
        E4M3.decode_code(256)


def test_get_format():
    for name, fmt in FORMATS.items():
        assert get_format(name) is fmt and get_format(name.upper()) is fmt and get_format(fmt) is fmt
    assert get_format(torch.float8_e4m3fn) is E4M3  # not UE4M3: the signed format owns the dtype
    assert get_format(torch.float8_e5m2) is E5M2 and get_format(torch.float8_e8m0fnu) is E8M0
    with pytest.raises(ValueError, match="unknown format"):
        get_format("e3m4")
    with pytest.raises(ValueError, match="unknown format"):
        get_format(torch.int8)


def test_formats_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        E4M3.mbits = 2


def test_cli_formats_prints_table(capsys):
    assert cli_main(["formats"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    header = lines[0].split()
    assert header[:5] == ["name", "bits", "E", "M", "bias"]
    rows = {ln.split()[0]: ln.split() for ln in lines[1:]}
    assert set(rows) == set(FORMATS)
    for name, fmt in FORMATS.items():
        r = rows[name]
        assert r[1:5] == [str(fmt.nbits), str(fmt.ebits), str(fmt.mbits), str(fmt.bias)]
        assert float(r[5]) == pytest.approx(fmt.max, rel=1e-5)
        assert float(r[7]) == pytest.approx(fmt.min_subnormal, rel=1e-5)
    assert rows["e4m3"][5] == "448" and rows["e5m2"][5] == "57344" and rows["e2m1"][5] == "6"
    assert rows["e4m3"][-1] == "float8_e4m3fn" and rows["e2m1"][-1] == "-"


def test_cli_version_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("lowbit ")
    assert cli_main([]) == 2  # no subcommand: help, non-zero
