"""Delayed scaling: amax history as module buffers (docs/design.md "Conventions", delayed scaling).

``update(amax)`` shifts amax into ``history[0]``; ``scale = A / fmax * 2^margin`` with ``A`` the
history max (or newest); a zero or non-finite amax never replaces a good scale; the state
round-trips through state_dict exactly; ``update`` runs on the meta device (so it never reads a
value on the host: no ``.item()``, no data-dependent Python branch). ``tests/test_compile.py``
also runs it under ``torch.compile(fullgraph=True)``.
"""
import io
import math
from fractions import Fraction

import pytest
import torch

from lowbit.dtypes import E4M3, E5M2, FP8Tensor
from lowbit.dtypes.formats import FP32
from lowbit.scaling import Current, Delayed, DelayedScalingState
from lowbit.scaling.delayed import reduce_histories
from lowbit.validate.oracle import quantize_exact, round_to_format


def ref_scale(a: float, fmt, margin: int) -> float:
    """fp32(fp32(a) / fmax) * 2^margin (the power-of-two factor is exact here)."""
    a = round_to_format(a, FP32)
    return round_to_format(Fraction(a) / Fraction(fmt.max), FP32) * 2.0 ** margin


def feed(st, amaxes):
    for a in amaxes:
        st.update(torch.tensor(a, dtype=torch.float32))


def test_history_shifts_newest_first():
    st = DelayedScalingState(Delayed(history_len=4), "e4m3")
    assert torch.equal(st.amax_history, torch.zeros(4)) and st.scale.item() == 1.0
    feed(st, [1.0, 2.0, 3.0])
    assert st.amax_history.tolist() == [3.0, 2.0, 1.0, 0.0]
    feed(st, [0.5, 0.25])
    assert st.amax_history.tolist() == [0.25, 0.5, 3.0, 2.0]  # 1.0 fell out


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0, 2, -1])
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_scale_from_history(algo, margin, fmt):
    st = DelayedScalingState(Delayed(history_len=3, margin=margin, amax_algo=algo), fmt)
    seq = [5.0, 300.0, 7.25, 0.1, 0.3, 1e-3]
    for i, a in enumerate(seq):
        feed(st, [a])
        window = seq[max(0, i - 2):i + 1]
        A = max(window) if algo == "max" else a
        assert st.scale.item() == ref_scale(A, fmt, margin), (i, A)


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("bad", [0.0, math.nan, math.inf, -math.inf])
def test_bad_amax_never_replaces_a_good_scale(algo, bad):
    st = DelayedScalingState(Delayed(history_len=2, amax_algo=algo), "e4m3")
    feed(st, [10.0])
    good = st.scale.clone()
    feed(st, [bad, bad, bad])  # the good amax has left the history: A == 0
    assert torch.equal(st.scale, good)
    assert st.amax_history.tolist() == [0.0, 0.0]  # non-finite recorded as 0
    assert torch.isfinite(st.amax_history).all()


def test_first_steps_start_from_scale_one():
    st = DelayedScalingState(Delayed(), "e4m3")
    feed(st, [0.0, math.nan])
    assert st.scale.item() == 1.0


def test_from_float_uses_the_previous_scale_then_records_amax():
    """Delayed: step t is cast with the scale made from steps < t; elements match the oracle."""
    recipe = Delayed(history_len=4)
    st = DelayedScalingState(recipe, recipe.format("input"))
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(4, 24, generator=g) * m for m in (1.0, 100.0, 0.01)]
    expected_scale = 1.0
    for i, x in enumerate(xs):
        q = FP8Tensor.from_float(x, recipe, "input", state=st)
        assert q._scale.item() == expected_scale and q.block.is_tensorwise
        want = [quantize_exact(v, expected_scale, E4M3) for v in x.flatten().tolist()]
        assert q._data.to(torch.float64).flatten().tolist() == want
        expected_scale = ref_scale(max(float(y.abs().max()) for y in xs[:i + 1]), E4M3, 0)
        assert st.scale.item() == expected_scale
    # a delayed scale that is too small saturates instead of overflowing (x=100 cast with scale 1)
    assert q.dequantize().isfinite().all()


def test_grad_role_uses_e5m2_state():
    recipe = Delayed()
    st = DelayedScalingState(recipe, recipe.format("grad"))
    q = FP8Tensor.from_float(torch.randn(4, 8), recipe, "grad", state=st)
    assert q._data.dtype == torch.float8_e5m2 and st.fmt is E5M2


def test_state_dict_round_trip_exact():
    recipe = Delayed(history_len=5, margin=1)
    st = DelayedScalingState(recipe, "e4m3")
    feed(st, [3.0, 1e-20, 7e4, 0.3])
    assert set(st.state_dict()) == {"amax_history", "scale"}
    buf = io.BytesIO()
    torch.save(st.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)
    st2 = DelayedScalingState(recipe, "e4m3")
    st2.load_state_dict(sd)
    assert torch.equal(st2.amax_history, st.amax_history) and torch.equal(st2.scale, st.scale)
    feed(st, [2.0])
    feed(st2, [2.0])
    assert torch.equal(st2.amax_history, st.amax_history) and torch.equal(st2.scale, st.scale)


def test_update_has_no_host_sync():
    """On the meta device any .item() / bool(tensor) would raise: update is pure tensor ops."""
    st = DelayedScalingState(Delayed(), "e4m3").to("meta")
    st.update(torch.empty((), device="meta"))
    FP8Tensor.from_float(torch.empty(4, 8, device="meta"), Delayed(), "input", state=st)
    assert st.scale.device.type == "meta"


def test_reduce_histories_is_one_collective_and_the_update_rule():
    """Two emulated ranks: one all_reduce (MAX with the other rank's flattened buffer) over states
    of mixed lengths, algos, margins and formats leaves each state as one fed the MAX of both
    ranks' amaxes (history and scale, bit for bit); a zero amax keeps the old scale."""
    recipes = [(Delayed(history_len=3), "e4m3"), (Delayed(history_len=5, amax_algo="most_recent"), "e5m2"),
               (Delayed(history_len=3, margin=2), "e5m2"), (Delayed(history_len=4), "e4m3")]
    seqs = [([2.0, 9.0], [3.0, 1.0]), ([0.5, 4.0, 1.0], [7.0, 2.0, 0.25]), ([1e-3], [2e-3]), ([0.0], [0.0])]
    ranks = [[DelayedScalingState(r, f) for r, f in recipes] for _ in range(2)]
    for i, st in enumerate(ranks[1]):
        st.scale.fill_(0.5)  # a scale that only the "keep the old scale" rule would leave
        ranks[0][i].scale.fill_(0.5)
    for rank in (0, 1):
        for st, seq in zip(ranks[rank], seqs):
            feed(st, seq[rank])
    other = torch.cat([st.amax_history for st in sorted(ranks[1], key=lambda s: s.recipe.history_len)])
    calls = []

    def all_reduce(buf):
        calls.append(buf.numel())
        torch.maximum(buf, other, out=buf)

    reduce_histories(ranks[0], all_reduce)
    assert calls == [3 + 3 + 4 + 5]
    for (recipe, fmt), st, (a, b) in zip(recipes, ranks[0], seqs):
        ref = DelayedScalingState(recipe, fmt)
        ref.scale.fill_(0.5)
        feed(ref, [max(x, y) for x, y in zip(a, b)])
        assert torch.equal(st.amax_history, ref.amax_history) and torch.equal(st.scale, ref.scale), recipe
    assert ranks[0][3].scale.item() == 0.5


def test_state_needs_a_delayed_recipe():
    with pytest.raises(TypeError, match="Delayed"):
        DelayedScalingState(Current(), "e4m3")
