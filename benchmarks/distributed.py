"""FSDP2 training of an 8B-shaped HF Llama stack on 1..N GPUs (NCCL): bf16 vs lowbit fp8 vs torchao.

    python benchmarks/distributed.py --out DIR [--quick] [--gpus 1,2] [--layers 4] [--variants ...]

The script spawns one process per GPU for each world size in ``--gpus`` (default: 1, 2, 4, ...
up to the GPUs present), with ``NCCL_NVLS_ENABLE=0`` and ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``
in every process's environment (NVLink multicast off). ``--device cpu`` runs the same on gloo
with a tiny config (a smoke test of the script, no figures worth keeping).

Model: ``LlamaForCausalLM`` from config, Llama-3-8B layer shapes (d 4096, FFN 14336, 32 heads,
8 KV heads, vocab 128256), ``--layers`` layers (4; quick 2), SDPA, random weights (seed 0, the
same on every rank and variant), fp32 master weights; ``fully_shard`` on every decoder layer and
on the root with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``; AdamW; eager.
The LM head stays in bf16 in every variant.

Variants:

* ``bf16``: the plain model (the anchor);
* ``lowbit-fp8``: ``lowbit.convert(model, "fp8")`` (delayed scaling; one amax all-reduce a step)
  and ``lowbit.distributed.prepare(model, fp8_all_gather=True)``: FP8 weights all-gathered;
* ``lowbit-fp8@bf16-gather``: the same without the FP8 all-gather (bf16 all-gather, cast after):
  its losses must equal ``lowbit-fp8``'s bit for bit (row ``bitwise_equal``, 1 = yes);
* ``lowbit-fp8-block``: ``"fp8-block"``, 128x128 weight blocks all-gathered in FP8;
* ``torchao-tensorwise`` (when installed): ``convert_to_float8_training`` with
  ``enable_fsdp_float8_all_gather=True`` and ``precompute_float8_dynamic_scale_for_fsdp`` after
  each optimizer step, as torchtitan runs it.

Per world size and variant: ``--parity-steps`` steps on a fixed global batch of ``max(--gpus)``
sequences of ``--parity-seq`` tokens split across the ranks (the same global batch at every world
size), then ``--warmup`` + ``--steps`` timed steps of ``--batch`` x ``--seq`` tokens per GPU (CUDA
events around each step; the median). Rows (``results.csv`` via ``common``), per variant and
world size: ``tokens_per_s_per_gpu`` (ratio: against bf16 at that world size; higher is better),
``scaling_efficiency`` (tokens/s per GPU against the same variant on 1 GPU), ``allgather_bytes_step``
(bytes received by one GPU from all-gathers in one timed step, counted by wrapping
``torch.distributed.all_gather_into_tensor`` / ``all_gather_single``; 0 on one GPU, where FSDP2
skips the collective; ratio: against bf16, lower is less traffic), ``gathered_weight_bytes`` (one
all-gather of every parameter in the representation gathered: FP8 bytes for FP8-gathered weights,
bf16 for the rest, from the parameter shapes), ``loss_parity`` (max over the parity steps of
|loss - loss on 1 GPU| / loss on 1 GPU, ratio: against bf16's own; N > 1 only), ``loss_vs_bf16``
(the same against bf16 at this world size: FP8's effect on the loss), ``peak_GiB``.
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import traceback

ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
os.environ.update(ENV)  # before torch: every process (spawned ones inherit it) sees it at NCCL init

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from common import append_results, env_info, parse_args, print_table, result_row, write_json  # noqa: E402

VARIANTS = ("bf16", "lowbit-fp8", "lowbit-fp8@bf16-gather", "lowbit-fp8-block", "torchao-tensorwise")
QUICK_VARIANTS = ("bf16", "lowbit-fp8", "lowbit-fp8@bf16-gather", "torchao-tensorwise")
LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                vocab_size=128256)
TINY = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
LR = 3e-4


def extra_args(p):
    p.add_argument("--gpus", default=None, help="world sizes, e.g. 1,2 (default: 1, 2, 4, ... up to the GPUs)")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--variants", default=None)
    p.add_argument("--batch", type=int, default=2, help="sequences per GPU in the timed steps")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--parity-steps", type=int, default=None)
    p.add_argument("--parity-seq", type=int, default=1024)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))


def settings(args) -> dict:
    q, cpu = args.quick, args.device == "cpu"
    n_dev = torch.cuda.device_count() if not cpu else 2
    gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else \
        [w for w in (1, 2, 4, 8, 16) if w <= max(n_dev, 1)]
    return dict(
        device=args.device, gpus=gpus, model=TINY if cpu else LLAMA_8B,
        layers=args.layers or (2 if q or cpu else 4),
        variants=[v for v in (args.variants.split(",") if args.variants else (QUICK_VARIANTS if q else VARIANTS))],
        batch=args.batch if not cpu else 2, seq=args.seq if not cpu else 32,
        steps=args.steps or (3 if q or cpu else 8), warmup=args.warmup or (2 if q or cpu else 3),
        parity_steps=args.parity_steps or (3 if q or cpu else 5), parity_seq=args.parity_seq if not cpu else 16,
        parity_batch=max(gpus))


# ---- one rank -----------------------------------------------------------------------------------
def build(cfg: dict, variant: str, device):
    """The sharded model and its optimizer step for ``variant``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM
    conf = LlamaConfig(**cfg["model"], num_hidden_layers=cfg["layers"], max_position_embeddings=cfg["seq"],
                       use_cache=False, tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(conf).float().train()
    after_step = None
    if variant.startswith("lowbit-"):
        import lowbit
        import lowbit.distributed
        fmt, _, gather = variant[len("lowbit-"):].partition("@")
        lowbit.convert(model, fmt)  # (prepares the model: a process group exists)
        if gather != "bf16-gather":
            lowbit.distributed.prepare(model, fp8_all_gather=True)
    elif variant == "torchao-tensorwise":
        from torchao.float8 import (Float8LinearConfig, convert_to_float8_training,
                                    precompute_float8_dynamic_scale_for_fsdp)
        convert_to_float8_training(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True),
                                   module_filter_fn=lambda mod, fqn: fqn != "lm_head")
        after_step = lambda: precompute_float8_dynamic_scale_for_fsdp(model)  # noqa: E731
    elif variant != "bf16":
        raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, foreach=True)
    return model, opt, after_step


def gathered_weight_bytes(model, world: int) -> int:
    """Bytes of one all-gather of every parameter, in the representation gathered: 1 a weight
    element gathered in FP8 (lowbit's rule ``fp8_gathered``; every torchao FSDP float8 weight),
    2 (bf16) the rest; block scales and padding left out."""
    from torch.distributed.tensor import DTensor
    from lowbit.distributed.fsdp import FP8GatherWeight, fp8_gathered
    total = 0
    for mod in model.modules():
        for p in mod.parameters(recurse=False):
            local = p._local_tensor if isinstance(p, DTensor) else p
            if isinstance(local, FP8GatherWeight):
                fp8 = fp8_gathered(mod.recipe, p.shape[0], world)
            else:
                fp8 = hasattr(local, "fsdp_pre_all_gather")
            total += p.numel() * (1 if fp8 else 2)
    return total


class GatherCounter:
    """Bytes received by this rank from all-gathers while ``on`` (wraps the c10d entry points)."""

    NAMES = ("all_gather_into_tensor", "all_gather_single")

    def __init__(self):
        import torch.distributed as dist
        self.dist, self.bytes, self.on, self._orig = dist, 0, False, {}
        for name in self.NAMES:
            fn = getattr(dist, name, None)
            if fn is not None:
                self._orig[name] = fn
                setattr(dist, name, self._wrap(fn))

    def _wrap(self, fn):
        def counted(output_tensor, *args, **kwargs):
            if self.on:
                self.bytes += output_tensor.numel() * output_tensor.element_size()
            return fn(output_tensor, *args, **kwargs)
        return counted


def batches(cfg, rank, world, n, seqs_global, seq, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, cfg["model"]["vocab_size"], (seqs_global, seq), generator=g)
        k = seqs_global // world
        out.append(ids[rank * k:(rank + 1) * k])
    return out


def run_variant(cfg, variant, rank, world, device, counter) -> dict:
    import torch.distributed as dist
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model, opt, after_step = build(cfg, variant, device)

    def step(ids):
        ids = ids.to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if after_step is not None:
            after_step()
        return loss.detach()

    parity = []
    for ids in batches(cfg, rank, world, cfg["parity_steps"], cfg["parity_batch"], cfg["parity_seq"], 1):
        loss = step(ids)
        dist.all_reduce(loss)
        parity.append(loss.item() / world)
    timed = batches(cfg, rank, world, cfg["warmup"] + cfg["steps"], cfg["batch"] * world, cfg["seq"], 2)
    for ids in timed[:cfg["warmup"]]:
        step(ids)
    times = []
    for i, ids in enumerate(timed[cfg["warmup"]:]):
        if i == 0:  # count the first timed step's all-gathers
            counter.on, counter.bytes = True, 0
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step(ids)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            import time
            t = time.perf_counter()
            step(ids)
            times.append((time.perf_counter() - t) * 1e3)
        counter.on = False
    ms = statistics.median(times)
    out = dict(parity=parity, step_ms=ms, tokens_per_s_per_gpu=cfg["batch"] * cfg["seq"] / ms * 1e3,
               allgather_bytes_step=counter.bytes, gathered_weight_bytes=gathered_weight_bytes(model, world),
               peak_GiB=torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else None)
    del model, opt
    return out


def rank_main(rank, world, port, cfg, out_path):
    import torch.distributed as dist
    os.environ.update(ENV, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = cfg["device"] == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    counter = GatherCounter()
    res = {}
    for variant in cfg["variants"]:
        try:
            res[variant] = run_variant(cfg, variant, rank, world, device, counter)
        except Exception as e:  # a failing variant is recorded, the others go on
            traceback.print_exc()
            res[variant] = {"error": f"{type(e).__name__}: {e}"[:300]}
        dist.barrier()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the parent: one spawn per world size, then rows ------------------------------------------
def rows_for(env, cfg, results) -> list:
    rows, table = [], []
    shape = f"Llama-3-8B shape L{cfg['layers']} {cfg['batch']}x{cfg['seq']}/gpu" if cfg["device"] == "cuda" else \
        f"tiny L{cfg['layers']} {cfg['batch']}x{cfg['seq']}/gpu (cpu smoke test)"
    one = results.get(1, {})

    def ok(r):
        return r is not None and "error" not in r

    for w, res in sorted(results.items()):
        base = res.get("bf16")
        for v, r in res.items():
            row = {"gpus": w, "variant": v}
            table.append(row)
            if not ok(r):  # in the table and the JSON, not in results.csv
                row["error"] = (r or {}).get("error", "no result")
                continue
            sh = f"{shape} x{w}"
            add = lambda metric, value, anchor="", ratio=None: rows.append(  # noqa: E731
                result_row(env, "fsdp2-train", sh, v, metric, value, anchor, ratio))
            tps = r["tokens_per_s_per_gpu"]
            row.update(tok_s_gpu=tps, step_ms=r["step_ms"], ag_MiB=r["allgather_bytes_step"] / 2 ** 20,
                       weights_MiB=r["gathered_weight_bytes"] / 2 ** 20, peak_GiB=r["peak_GiB"])
            add("tokens_per_s_per_gpu", tps, "bf16", tps / base["tokens_per_s_per_gpu"] if ok(base) else None)
            if ok(one.get(v)):
                add("scaling_efficiency", tps / one[v]["tokens_per_s_per_gpu"], f"{v} on 1 GPU")
            add("allgather_bytes_step", r["allgather_bytes_step"], "bf16",
                r["allgather_bytes_step"] / base["allgather_bytes_step"] if ok(base) and base["allgather_bytes_step"]
                else None)
            add("gathered_weight_bytes", r["gathered_weight_bytes"], "bf16",
                r["gathered_weight_bytes"] / base["gathered_weight_bytes"] if ok(base) else None)
            if r["peak_GiB"] is not None:
                add("peak_GiB", r["peak_GiB"])
            if ok(base):
                row["loss_vs_bf16"] = max(abs(a / b - 1) for a, b in zip(r["parity"], base["parity"]))
                add("loss_vs_bf16", row["loss_vs_bf16"], "bf16")
            if w > 1 and ok(one.get(v)):
                dev = max(abs(a / b - 1) for a, b in zip(r["parity"], one[v]["parity"]))
                bdev = max(abs(a / b - 1) for a, b in zip(base["parity"], one["bf16"]["parity"])) \
                    if ok(base) and ok(one.get("bf16")) else None
                row["loss_parity"] = dev
                add("loss_parity", dev, "bf16's own", dev / bdev if bdev else None)
            if v == "lowbit-fp8" and ok(res.get("lowbit-fp8@bf16-gather")):
                row["bitwise"] = int(r["parity"] == res["lowbit-fp8@bf16-gather"]["parity"])
                add("bitwise_equal", row["bitwise"], "lowbit-fp8@bf16-gather")
    return rows, table


def main():
    import torch.multiprocessing as mp
    args = parse_args(__doc__.splitlines()[0], extra_args)
    cfg = settings(args)
    if cfg["device"] == "cuda" and max(cfg["gpus"]) > torch.cuda.device_count():
        raise SystemExit(f"--gpus {cfg['gpus']}: only {torch.cuda.device_count()} GPUs here")
    env = env_info()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in cfg["gpus"]:
            path = os.path.join(tmp, f"w{w}.json")
            try:
                mp.start_processes(rank_main, args=(w, free_port(), cfg, path), nprocs=w, start_method="spawn")
                with open(path) as f:
                    results[w] = json.load(f)
            except Exception as e:  # a world size that fails is recorded, the others go on
                traceback.print_exc()
                results[w] = {v: {"error": f"{type(e).__name__}: {e}"[:300]} for v in cfg["variants"]}
    rows, table = rows_for(env, cfg, results)
    print(append_results(rows, args.out))
    write_json(args.out, "distributed", {"env": env, "settings": cfg, "results": results, "table": table})
    print_table(table, ["gpus", "variant", "tok_s_gpu", "step_ms", "ag_MiB", "weights_MiB", "peak_GiB",
                        "loss_vs_bf16", "loss_parity", "bitwise", "error"])


if __name__ == "__main__":
    main()
