"""The counter-based draws of stochastic rounding (``lowbit.dtypes.philox``): Random123's known
answers, the same words as Triton's own Philox (``tl.philox_impl``, interpreted), and draws that
depend on the seed, stream, step and index and on nothing else."""
import pytest
import torch

from lowbit.dtypes.philox import Philox, philox4x32


def _t(*v):
    return torch.tensor(v, dtype=torch.int64)


@pytest.mark.parametrize("ctr,key,out", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
], ids=["zeros", "ones", "pi"])
def test_philox4x32_10_known_answers(ctr, key, out):
    """Random123's kat_vectors for philox4x32_10."""
    words = philox4x32(*(_t(c) for c in ctr), *key)
    assert [int(w) for w in words] == list(out)


def test_the_same_words_as_tritons_philox(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import triton
    import triton.language as tl

    from lowbit.kernels.triton.runtime import runnable

    @triton.jit
    def words(c_ptr, o_ptr, k0, k1, N: tl.constexpr):
        i = tl.arange(0, N) * 4
        a, b, c, d = tl.philox_impl(tl.load(c_ptr + i).to(tl.uint32), tl.load(c_ptr + i + 1).to(tl.uint32),
                                    tl.load(c_ptr + i + 2).to(tl.uint32), tl.load(c_ptr + i + 3).to(tl.uint32),
                                    k0.to(tl.uint32), k1.to(tl.uint32))
        tl.store(o_ptr + i, a.to(tl.int64))
        tl.store(o_ptr + i + 1, b.to(tl.int64))
        tl.store(o_ptr + i + 2, c.to(tl.int64))
        tl.store(o_ptr + i + 3, d.to(tl.int64))

    g = torch.Generator().manual_seed(0)
    ctr = torch.randint(0, 2 ** 32, (64, 4), generator=g, dtype=torch.int64)
    ctr[0], ctr[1] = 0, 2 ** 32 - 1
    got = torch.zeros_like(ctr)
    runnable(words)[(1,)](ctr, got, 123456789, 4000000000, N=64)
    ref = torch.stack(philox4x32(*ctr.unbind(1), 123456789, 4000000000), 1)
    assert torch.equal(got & 0xFFFFFFFF, ref)


def test_draws_are_24_bit_uniforms_of_seed_stream_step_and_index():
    u = Philox(_t(7, 3), 1).uniform((64, 100), "cpu")
    assert u.dtype == torch.float32 and u.shape == (64, 100)
    assert 0 <= float(u.min()) and float(u.max()) < 1 and torch.equal(u * 2 ** 24, (u * 2 ** 24).floor())
    assert abs(float(u.mean()) - 0.5) < 5 * (1 / 12 / u.numel()) ** 0.5  # mean of U[0, 1) within 5 sigma
    assert torch.equal(u, Philox(_t(7, 3), 1).uniform((64, 100), "cpu"))  # no state: the same key, the same draw
    assert torch.equal(u.reshape(-1)[:300], Philox(_t(7, 3), 1).uniform((300,), "cpu"))  # by row-major index
    for other in (Philox(_t(8, 3), 1), Philox(_t(7, 4), 1), Philox(_t(7, 3), 0), Philox(_t(7, 3 + 2 ** 32), 1)):
        v = other.uniform((64, 100), "cpu")
        assert float((u == v).float().mean()) < 0.01  # any change of the key draws anew


def test_bad_keys_are_refused():
    with pytest.raises(TypeError, match="int64"):
        Philox(torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="int64"):
        Philox(_t(1, 2, 3))
    with pytest.raises(ValueError, match="stream"):
        Philox(_t(1, 2), -1)
