"""lowbit under torch.distributed on the CPU (gloo).

One 2-process run (``dist_worker.py``, a subprocess per rank, a free port, a timeout) trains the
same MLP under DDP and FSDP2 (``fully_shard`` runs on the CPU with gloo on torch 2.13) with half
the batch per rank and checks, against one process:

* loss trajectories: ``fp8`` (delayed) against one process on the whole batch (the MAX of the
  ranks' amaxes is the whole batch's); ``fp8-block`` (and ``fp8-current``, ``fp8-rowwise``,
  ``mxfp8``) against one process accumulating the ranks' half batches: their activation and
  gradient scales come from each rank's own tensors (1x128 wgrad tiles run along the tokens,
  current scales take the local amax), as in any data-parallel run of these recipes. TOL: the
  runs differ only in the order of fp32 additions (wgrad partial sums per rank, the loss mean),
  a few fp32 ulps a step (seen: 5e-8 to 2.3e-7 over 6 steps); 1e-5 is 50x below the FP8-vs-fp32
  gap of these runs (5e-4 to 1e-3) and 100x below the control that never prepared (1.2e-3), so
  a scale that differs from one process's fails it. nvfp4 (stochastic rounding): within FP4 noise.
* the recipe state in ``state_dict()`` identical on both ranks after every step (and the
  never-prepared control differs: the check has teeth); the FSDP2 forward sees FP8 weights;
* a DCP round trip (model, optimizer, recipe state) exact, and training resumes bit for bit;
* Megatron-style tensor-parallel shards: the synced state equals the whole layer's in one process;
* ranks converted with different recipes: a clear ValueError on both ranks.

In this process: no process group -> a clear error; on a one-rank group, FSDP2's FP8 all-gather
gives bit-identical forward and backward to the plain converted layer, and DTensor layers or an
FP8 all-gather weight outside FSDP2 are clear errors; uneven shards (3 ranks, emulated) gather
exactly the plain cast.
"""
import json
import os
import socket
import subprocess
import sys
import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn

import lowbit
import lowbit.distributed
from lowbit.kernels import quantize_fp8
from lowbit.scaling import Delayed

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOL = 1e-5
WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "dist_worker.py"), str(r), str(WORLD), str(port),
                               str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(WORLD)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    with open(out / "result.json") as f:
        return json.load(f)


def _rel(a, b):
    return max(abs(x / y - 1) for x, y in zip(a, b))


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
@pytest.mark.parametrize("fmt,ref,steps", [("fp8", "single", 6), ("fp8-block", "accum", 6),
                                           ("fp8-current", "accum", 3), ("fp8-rowwise", "accum", 3),
                                           ("mxfp8", "accum", 3)])
def test_loss_trajectory_matches_one_process(run, engine, fmt, ref, steps):
    got, want = run[f"{engine}/{fmt}"], run[f"{ref}/{fmt}"]
    assert len(got) == len(want) == steps
    assert _rel(got, want) <= TOL, (got, want)
    assert _rel(want, run["single/fp32"]) > 10 * TOL  # the tolerance would see a recipe change


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_nvfp4_trains_like_one_process(run, engine):
    """nvfp4 rounds gradients stochastically from a generator per tensor, so the ranks' half
    tensors draw other random bits than the accumulated run: they agree within FP4's noise (less
    than half the gap between nvfp4 and fp32); the step counters stay equal on the ranks."""
    got, want = run[f"{engine}/nvfp4"], run["accum/nvfp4"]
    assert len(got) == len(want) == 3
    assert _rel(got, want) < _rel(want, run["single/fp32"]) / 2
    assert run[f"{engine}/nvfp4/same"] == [True] * 3


def test_control_never_prepared_differs(run):
    """A model converted before the process group existed and never prepared: ranks' states drift
    apart and the trajectory leaves one process's by more than TOL."""
    assert not any(run["ddp/unprepared/same"])
    assert _rel(run["ddp/unprepared"], run["single/fp8"]) > TOL


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
@pytest.mark.parametrize("fmt", ["fp8", "fp8-block"])
def test_recipe_state_identical_on_ranks_after_every_step(run, engine, fmt):
    assert run[f"{engine}/{fmt}/same"] == [True] * 6


def test_fsdp_forward_sees_fp8_weights(run):
    """Tensorwise: both converted weights gathered in FP8; fp8-block: the 256-row weight (whole
    128x128 blocks per shard) in FP8, the 64-row one (blocks would straddle the shards) in high
    precision; rowwise, MX and NV weights in high precision. The head is never converted."""
    fp8, hp = "FP8Tensor", "Parameter"
    assert run["fsdp/fp8/weights"] == run["fsdp/fp8-current/weights"] == [fp8, fp8, hp]
    assert run["fsdp/fp8-block/weights"] == [fp8, hp, hp]
    for fmt in ("fp8-rowwise", "mxfp8", "nvfp4"):
        assert run[f"fsdp/{fmt}/weights"] == [hp, hp, hp]


def test_dcp_round_trip_is_exact(run):
    assert run["dcp/keys"] and run["dcp/model_equal"] and run["dcp/primed_equal"]
    assert run["dcp/loaded"] == run["dcp/resumed"]


def test_tensor_parallel_shards_take_the_whole_tensor_amax(run):
    assert run["tp/ranks"] == run["tp/single"]


def test_ranks_with_different_recipes_get_a_clear_error(run):
    for msg in run["bad/recipes/all"]:
        assert msg and "converted differently" in msg and "Delayed(" in msg and "Blockwise(" in msg


# ---- in this process ------------------------------------------------------------------------
def _mlp(fmt, n=128):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, n), nn.GELU(), nn.Linear(n, 64), nn.GELU(), nn.Linear(64, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lowbit.convert(m, fmt)


def test_prepare_without_process_group_is_a_clear_error():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        lowbit.distributed.prepare(_mlp("fp8"))


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _fsdp(model, fp8, mp=None):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    lowbit.distributed.prepare(model, fp8_all_gather=fp8)
    kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=mp)} if mp else {}
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **kw)
    return fully_shard(model, **kw)


def _steps(model):
    out = []
    for step in range(2):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(32, 64, generator=g).requires_grad_()
        y = model(x)
        y.float().square().sum().backward()
        grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in model.parameters()]
        out.append((y.detach(), x.grad, *grads))
        with torch.no_grad():
            for p in model.parameters():
                p -= 1e-3 * p.grad
                p.grad = None
    return out


@pytest.mark.filterwarnings("ignore:.*returned a view tensor")  # FSDP2 on lowbit's reshape
@pytest.mark.parametrize("fmt", ["fp8", "fp8-current", "fp8-block"])
def test_fp8_all_gather_is_bit_identical_to_the_plain_layer(one_rank, fmt):
    """Two steps of forward and backward: outputs, input and weight gradients equal bit for bit
    (fp32 params: against the unsharded converted model; bf16 param_dtype: against FSDP2's
    high-precision all-gather of the same model)."""
    for a, b in zip(_steps(_mlp(fmt)), _steps(_fsdp(_mlp(fmt), fp8=True))):
        assert all(torch.equal(u, v) for u, v in zip(a, b))
    for a, b in zip(_steps(_fsdp(_mlp(fmt), False, torch.bfloat16)), _steps(_fsdp(_mlp(fmt), True, torch.bfloat16))):
        assert all(torch.equal(u, v) for u, v in zip(a, b))


def test_dtensor_layers_and_unsharded_fp8_gather_are_clear_errors(one_rank):
    """A lowbit layer handed DTensors (a DTensor tensor-parallel style) and an FP8 all-gather
    weight outside FSDP2 fail at the first forward, saying what to do instead."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    tp = parallelize_module(_mlp("fp8"), init_device_mesh("cpu", (1,)), {"0": ColwiseParallel()})
    with pytest.raises(NotImplementedError, match="DTensor .*Megatron style"):
        tp(torch.randn(4, 64))
    plain = lowbit.distributed.prepare(_mlp("fp8"), fp8_all_gather=True)
    with pytest.raises(RuntimeError, match="fp8_all_gather=True is for FSDP2"):
        plain(torch.randn(4, 64))


class _Mesh:
    def __init__(self, n):
        self.n = n

    def size(self):
        return self.n


class _Policy:
    param_dtype = None


def test_uneven_shards_gather_the_plain_cast():
    """80 rows over 3 emulated ranks (27, 27, 26: the last shard zero-padded): the gathered codes
    are the plain cast of the whole weight with the same delayed scale, and the MAX of the
    ranks' recorded amaxes is the whole weight's. 128x128 blocks over such shards go in high
    precision."""
    from lowbit.distributed.fsdp import WeightGather
    layer = lowbit.convert(nn.Linear(64, 80), "fp8", filter=lambda n, m: True)
    layer(torch.randn(4, 64)).sum().backward()  # primed, a history
    gather, w = WeightGather(), layer.weight.detach()
    ranks = [lowbit.convert(nn.Linear(64, 80), "fp8", filter=lambda n, m: True) for _ in range(3)]
    inputs, metas = [], []
    for r, mod in enumerate(ranks):
        mod.load_state_dict(layer.state_dict())
        (data,), meta = gather.pre_all_gather(w[27 * r: 27 * (r + 1)], _Mesh(3), (80, 64), mod, _Policy())
        assert data.shape == (27, 64)
        inputs.append(data)
        metas.append(meta)
    assert all(torch.equal(m[2], metas[0][2]) for m in metas)  # one scale on every rank
    gathered, _ = WeightGather.post_all_gather((torch.cat(inputs),), metas[0], torch.float32)
    got = torch.as_strided(gathered, (80, 64), (64, 1))
    ref_state = lowbit.convert(nn.Linear(64, 80), "fp8", filter=lambda n, m: True)
    ref_state.load_state_dict(layer.state_dict())
    want = quantize_fp8(w, Delayed(), "weight", ref_state.lowbit_state.weight)
    assert torch.equal(got._data.view(torch.uint8), want._data.view(torch.uint8))
    assert torch.equal(got._scale, want._scale)
    hist = torch.stack([m.lowbit_state.weight.amax_history for m in ranks]).amax(0)
    assert torch.equal(hist, ref_state.lowbit_state.weight.amax_history)
    block = lowbit.convert(nn.Linear(64, 256), "fp8-block", filter=lambda n, m: True)
    (x,), meta = gather.pre_all_gather(block.weight.detach()[:86], _Mesh(3), (256, 64), block, _Policy())
    assert meta == ("hp",) and x.dtype == torch.float32 and x.shape == (86, 64)
