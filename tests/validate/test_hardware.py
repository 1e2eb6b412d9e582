"""``lowbit audit hardware``: without a GPU it says so and exits 2; the probes' arithmetic recovers
the accumulator of a simulated tensor core (bits kept, truncation or rounding, products per MMA
group, promotion interval) exactly."""
from fractions import Fraction

import pytest
import torch

from lowbit.cli import main
from lowbit.dtypes.formats import BF16, E4M3, FP32
from lowbit.validate.hardware import NoGPU, audit_hardware, probe_bits, probe_promotion
from lowbit.validate.oracle import round_to_format


def _round(v: Fraction, bits: int, mode: str) -> Fraction:
    if v == 0:
        return v
    e = v.numerator.bit_length() - v.denominator.bit_length()  # floor(log2 |v|) up to one
    a = abs(v)
    if Fraction(2) ** e > a:
        e -= 1
    ulp = Fraction(2) ** (e - bits + 1)
    q, r = divmod(a, ulp)
    if mode == "nearest" and (r > ulp / 2 or (r == ulp / 2 and q % 2)):
        q += 1
    return (1 if v > 0 else -1) * q * ulp


def simulated(bits: int, group: int = 32, promote=None, mode: str = "truncation"):
    """A tensor core: exact products, summed ``group`` at a time into a ``bits``-bit running sum,
    restarted and added in fp32 every ``promote`` products (None: never)."""
    def mm(A, B):
        a, b = A[0].double().tolist(), B[:, 0].double().tolist()
        K = len(a)
        L = promote or K
        total = Fraction(0)
        for c0 in range(0, K, L):
            acc = Fraction(0)
            for g0 in range(c0, min(c0 + L, K), group):
                part = sum(Fraction(a[k]) * Fraction(b[k]) for k in range(g0, min(g0 + group, c0 + L, K)))
                acc = _round(acc + part, bits, mode)
            total = Fraction(round_to_format(total + acc, FP32, saturate=False))
        return torch.full((A.shape[0], B.shape[1]), float(total))
    return mm


@pytest.mark.parametrize("bits,group,mode", [(14, 32, "truncation"), (10, 4, "nearest"), (20, 1, "truncation"),
                                             (17, 16, "nearest")])
def test_probe_bits_recovers_the_simulated_accumulator(bits, group, mode):
    for far in (False, True):
        got = probe_bits(simulated(bits, group, mode=mode), E4M3, K=64, far=far)
        assert got == {"bits": bits, "rounding": mode, "at_least": False}


def test_a_full_fp32_accumulator_reads_as_at_least_24_bits():
    got = probe_bits(lambda A, B: (A.double() @ B.double()).float(), BF16, K=32)
    assert got == {"bits": 24, "rounding": None, "at_least": True}


@pytest.mark.parametrize("promote", [32, 128, None])
def test_probe_promotion_recovers_the_interval(promote):
    got = probe_promotion(simulated(14, 32, promote), E4M3, K=1024)
    want_lost = 1023 if promote is None else promote - 1
    assert got["interval"] == promote and got["survivors"] == 1023 - want_lost


def test_promotion_is_unobservable_when_nothing_is_lost():
    got = probe_promotion(lambda A, B: (A.double() @ B.double()).float(), E4M3, K=512)
    assert got["survivors"] == 511 and got["lost"] == 0


def test_without_a_gpu_it_says_so_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NoGPU, match="no CUDA GPU"):
        audit_hardware()
    assert main(["audit", "hardware", "--json"]) == 2
    assert "lowbit audit hardware: no CUDA GPU" in capsys.readouterr().err
