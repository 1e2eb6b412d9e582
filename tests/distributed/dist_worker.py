"""One rank of the 2-process gloo run behind ``test_distributed.py``:
``python dist_worker.py RANK WORLD PORT OUT_DIR``. Measures, does not assert: rank 0 writes
``OUT_DIR/result.json`` and the test asserts on it.

Before the process group exists (so nothing is prepared) it trains the one-process references on
the whole batch; then, on gloo, the same models under DDP and FSDP2 (each rank half the batch),
the recipe state of both ranks after every step, a DCP round trip, a control that was never
prepared, Megatron-style tensor-parallel shards, and the two bad inputs."""
import datetime
import json
import os
import sys
import traceback
import warnings

import torch
import torch.distributed as dist
from torch import nn

import lowbit
import lowbit.distributed
from lowbit.nn import is_state_key

BATCH, LR = 32, 0.05
# format -> (steps, the one-process reference: the whole batch, or the ranks' halves accumulated)
FORMATS = {"fp8": (6, "single"), "fp8-block": (6, "accum"), "fp8-current": (3, "accum"),
           "fp8-rowwise": (3, "accum"), "mxfp8": (3, "accum"), "nvfp4": (3, "accum")}


def make(fmt=None):
    """MLP (``fmt`` None: left in fp32) whose first weight (256 rows) shards into whole 128x128
    blocks over 2 ranks, second (64 rows) does not, and whose head (5 rows, kept in high
    precision) shards unevenly (3 + 2)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.GELU(), nn.Linear(64, 5))
    if fmt is None:
        return m
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the head stays in high precision
        return lowbit.convert(m, fmt)


def batch(step, rank=0, world=1):
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(BATCH, 64, generator=g), torch.randn(BATCH, 5, generator=g)
    n = BATCH // world
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def recipe_state(model):
    """Recipe buffers (tensors) and extra state (NVFP4's stochastic-rounding step: a dict)."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in model.state_dict().items()
            if is_state_key(k)}


def train(model, steps, start=0, rank=0, world=1, opt=None, each_step=None):
    """Loss of the whole batch per step (the mean of the ranks' half-batch losses)."""
    opt = opt or torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for step in range(start, start + steps):
        x, y = batch(step, rank, world)
        loss = (model(x) - y).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if world > 1:
            loss = loss.detach().clone()
            dist.all_reduce(loss)
            loss /= world
        losses.append(loss.item())
        if each_step is not None:
            each_step(model)
    return losses, opt


def train_accum(model, steps, world):
    """One process, each step the ranks' half batches one after the other, gradients accumulated
    (loss / world: the mean of the ranks' losses, as data parallelism averages gradients)."""
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for step in range(steps):
        total = 0.0
        for rank in range(world):
            x, y = batch(step, rank, world)
            loss = (model(x) - y).square().mean() / world
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses


def weight_types(model) -> list:
    """The type of each Linear's weight as its first forward sees it."""
    seen, handles = [], []

    def hook(mod, args):
        seen.append(type(mod.weight).__name__)
        handles.pop(0).remove()

    for layer in model:
        if isinstance(layer, nn.Linear):
            handles.append(layer.register_forward_pre_hook(hook))
    return seen


def same_on_ranks(sd) -> bool:
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, sd)
    same = lambda u, v: torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v  # noqa: E731
    return all(a.keys() == everyone[0].keys() and all(same(a[k], everyone[0][k]) for k in a) for a in everyone[1:])


def shard(model, fp8_all_gather=True):
    from torch.distributed.fsdp import fully_shard
    lowbit.distributed.prepare(model, fp8_all_gather=fp8_all_gather)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def tp_model():
    """32 output rows; the weight's and the output gradient's largest values sit in rows (columns)
    16..31, rank 1's shard: rank 0 alone would see a smaller amax."""
    torch.manual_seed(1)
    layer = nn.Linear(64, 32, bias=False)
    with torch.no_grad():
        layer.weight[20, 5] = 3.0
    return lowbit.convert(layer, "fp8", filter=lambda n, m: True)


def tp_step(layer, rows=slice(None)):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(8, 64, generator=g)
    dy = torch.randn(8, 32, generator=g)
    dy[1, 20] = 50.0
    layer(x).backward(dy[:, rows])


def main(rank, world, port, out_dir):
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*returned a view tensor")  # FSDP2 on lowbit's reshape
    res = {}
    # ---- one process, whole batch (no process group yet: nothing prepared) ----------------------
    for fmt, (steps, ref) in FORMATS.items():
        model = make(fmt)
        res[f"{ref}/{fmt}"] = train(model, steps)[0] if ref == "single" else train_accum(model, steps, world)
    res["single/fp32"] = train(make(), 6)[0]
    unprepared = make("fp8")  # converted before the group existed, never prepared: the control
    tp_full = tp_model()
    tp_step(tp_full)
    res["tp/single"] = {k: v.tolist() for k, v in recipe_state(tp_full).items()}

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    from torch.nn.parallel import DistributedDataParallel as DDP

    def record(key):
        flags = res.setdefault(key, [])
        return lambda model: flags.append(same_on_ranks(recipe_state(model)))

    for fmt, (steps, _) in FORMATS.items():
        model = make(fmt)  # the group exists: convert prepares the model
        res[f"ddp/{fmt}"] = train(DDP(model), steps, rank=rank, world=world, each_step=record(f"ddp/{fmt}/same"))[0]
        model = shard(make(fmt))
        res[f"fsdp/{fmt}/weights"] = weight_types(model)
        res[f"fsdp/{fmt}"], opt = train(model, steps, rank=rank, world=world,
                                        each_step=record(f"fsdp/{fmt}/same"))
        if fmt == "fp8":
            dcp_round_trip(res, model, opt, rank, world, out_dir, steps)
    res["ddp/unprepared"] = train(DDP(unprepared), 6, rank=rank, world=world,
                                  each_step=record("ddp/unprepared/same"))[0]

    # ---- tensor parallel, Megatron style: each rank holds 16 of the 32 output rows --------------
    full = tp_model()
    local = lowbit.convert(nn.Linear(64, 16, bias=False), "fp8", filter=lambda n, m: True)
    rows = slice(16 * rank, 16 * (rank + 1))
    with torch.no_grad():
        local.weight.copy_(full.weight[rows])
    tp_step(local, rows)
    res["tp/ranks"] = {k: v.tolist() for k, v in recipe_state(local).items()}

    # ---- bad input: ranks converted with different recipes -------------------------------------
    try:
        make("fp8" if rank == 0 else "fp8-block")
        res["bad/recipes"] = None
    except ValueError as e:
        res["bad/recipes"] = str(e)
    everyone = [None] * world
    dist.all_gather_object(everyone, res["bad/recipes"])
    res["bad/recipes/all"] = everyone
    if rank == 0:
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


def dcp_round_trip(res, model, opt, rank, world, out_dir, steps):
    """Save model + optimizer (sharded, recipe state included) with DCP after ``steps``, load into
    a fresh sharded model, compare every tensor, and train both on."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.tensor import DTensor
    path = os.path.join(out_dir, "dcp")
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
    fresh = shard(make("fp8"))
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=LR, momentum=0.9)
    train(fresh, 1, start=100, rank=rank, world=world, opt=fresh_opt)  # other values and momentum first
    msd2, osd2 = get_state_dict(fresh, fresh_opt)
    state = {"model": msd2, "optim": osd2}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    full = lambda t: t.full_tensor() if isinstance(t, DTensor) else t  # noqa: E731
    a, b = model.state_dict(), fresh.state_dict()
    res["dcp/keys"] = sorted(a) == sorted(b) and any(is_state_key(k) for k in a)
    res["dcp/model_equal"] = all(torch.equal(full(a[k]), full(b[k])) for k in a)
    res["dcp/primed_equal"] = [m.lowbit_state.input.primed for m in fresh if hasattr(m, "lowbit_state")] == \
        [m.lowbit_state.input.primed for m in model if hasattr(m, "lowbit_state")]
    res["dcp/resumed"] = train(model, 2, start=steps, rank=rank, world=world, opt=opt)[0]
    res["dcp/loaded"] = train(fresh, 2, start=steps, rank=rank, world=world, opt=fresh_opt)[0]


if __name__ == "__main__":
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    try:
        main(rank, world, port, out)
    except Exception:
        traceback.print_exc()
        sys.exit(1)
