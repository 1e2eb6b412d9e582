"""GPU bit-exactness record: one sha256 digest per case of every kernel lowbit launches, to compare
two trees (before and after a change) on the same machine.

    python3 benchmarks/bitexact.py --out DIR [--device cpu] [--shard I/N]

``--shard I/N`` runs the I-th (0-based) of N shares of the cases and writes ``DIR/bitexact.I.json``:
N processes compile their kernels in parallel; the union of the shares is the whole record. Cases
that share kernels (a cast of one format, a GEMM's scale layout, a format's Linear) stay together.

Only public API that every tree of the layout change has: ``lowbit.kernels.quantize_fp8`` /
``quantize_fp8_t`` / ``quantize_fp4`` / ``scaled_mm`` with ``backend="triton"``, the recipes
(``lowbit.convert.FORMATS``), ``FP8Tensor`` / ``FP4Tensor``, ``DelayedScalingState`` and
``lowbit.nn.Linear``. Inputs come from seeded CPU generators. Cases:

* casts of every recipe and role, with and without the transposed copy (FP8), bf16 and fp32, on a
  regular shape, a ragged one, rows past 8192 elements, and a tensor of special values (NaN with
  payloads, +-inf, -0, subnormals, saturating values); delayed scaling over three steps (the
  digests include the state's history and scale); FP4 with and without the Hadamard transform and
  with stochastic rounding (a seeded generator);
* FP8 GEMMs of every scale layout (tensorwise, rowwise, 1x128 x 128x128, wgrad's 1x128 x 128x1,
  MX), fast accumulation on and off, large and small M, with a bias; FP4 x FP4 (NV, MX) and the
  weight-only GEMM (bf16 x NV / MX weight, M = 1 and 16);
* a converted Linear, forward and backward over three steps, for every format (output, both
  gradients, the delayed-scaling buffers).

Prints ``case digest`` lines as it goes and keeps ``DIR/bitexact.json`` ({case: digest}) written
after every case (a run cut short compares on the cases it reached); a case
that raises records its error instead. Two trees agree when their JSON files are equal.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def digest(*tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().contiguous().cpu()
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


def lowbit_parts(q) -> list:
    """The inner tensors of an FP8Tensor / FP4Tensor (data, scales, NV tensor scale)."""
    names, _ = q.__tensor_flatten__()
    return [getattr(q, n) for n in names]


def sample(rows, cols, seed, dtype, device, special=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.exp2(torch.randint(-8, 8, (rows, 1), generator=g).float())
    if special:
        flat = x.view(-1)
        vals = (float("nan"), float("inf"), -float("inf"), -0.0, 1e-40, 3e4, 448.0, 464.0, 57344.0, 1e-30)
        for i, v in enumerate(vals):
            flat[(i * 7919) % flat.numel()] = v
        x[0, :32] = 0.0
        x[1, :32] = float("nan")
        x[2, 32:64] = float("inf")
    return x.to(dtype).to(device)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--device", default="cuda")
    p.add_argument("--shard", default="0/1", help="I/N: run the I-th of N shares of the cases (default all)")
    args = p.parse_args()
    shard, shards = (int(v) for v in args.shard.split("/"))
    import lowbit  # noqa: F401  (registers the backends)
    from lowbit.convert import FORMATS
    from lowbit.dtypes import FP4Tensor, FP8Tensor
    from lowbit.kernels import quantize_fp4, quantize_fp8, quantize_fp8_t, scaled_mm
    from lowbit.scaling import DelayedScalingState
    from lowbit.scaling.hadamard import random_signs
    from lowbit.scaling.recipes import Blockwise, Current, Delayed, Rowwise

    dev = torch.device(args.device)
    small = dev.type == "cpu"  # the interpreter: smaller shapes
    out, t0 = {}, time.time()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bitexact.json" if shards == 1 else f"bitexact.{shard}.json")
    groups: dict[str, int] = {}  # group -> its index in order of first appearance

    def save():
        with open(path, "w") as f:
            json.dump(out, f, indent=0, sort_keys=True)

    def case(name, fn):
        words = name.split()
        group = name if words[0] == "linear" else " ".join(words[:2])
        if groups.setdefault(group, len(groups)) % shards != shard:
            return
        try:
            d = fn()
        except Exception as e:  # a failing case is recorded; the others go on
            d = f"error: {type(e).__name__}: {str(e)[:200]}"
        out[name] = d
        print(f"{name:60s} {d}", flush=True)
        save()  # after every case: a run cut short still compares on the cases it reached

    shapes = [(256, 512), (37, 300), (40, 8200)] if not small else [(64, 256), (37, 300)]
    for fmt, make in FORMATS.items():
        recipe = make()
        for role in ("input", "weight", "grad"):
            for si, (R, C) in enumerate(shapes + [("special", 0)]):
                for dtype in (torch.bfloat16, torch.float32):
                    if R == "special":
                        x = sample(96, 512, 7, dtype, dev, special=True)
                    else:
                        x = sample(R, C, 11 * si + 3, dtype, dev)
                    tag = f"{fmt} {role} {tuple(x.shape)} {str(dtype)[6:]}"
                    if recipe.kind == "fp4":
                        if x.shape[-1] % 32:
                            continue

                        def fp4(x=x):
                            g = torch.Generator(device=dev).manual_seed(5)
                            q = quantize_fp4(x, recipe, role, g, None, backend="triton")
                            return digest(*lowbit_parts(q))
                        case(f"cast {tag}", fp4)
                        if x.shape[-1] % 16 == 0:
                            def fp4h(x=x):
                                g = torch.Generator(device=dev).manual_seed(5)
                                q = quantize_fp4(x, recipe, role, g, random_signs(3, dev), backend="triton")
                                return digest(*lowbit_parts(q))
                            case(f"cast+hadamard {tag}", fp4h)
                        continue

                    def fp8(x=x, transposed=False):
                        st = DelayedScalingState(recipe, recipe.format(role)).to(dev) \
                            if isinstance(recipe, Delayed) else None
                        parts = []
                        for step in range(3 if st is not None else 1):
                            xs = x * (2.0 ** step)
                            if transposed:
                                q, qt = quantize_fp8_t(xs, recipe, role, st, backend="triton")
                                parts += lowbit_parts(q) + lowbit_parts(qt)
                            else:
                                parts += lowbit_parts(quantize_fp8(xs, recipe, role, st, backend="triton"))
                            if st is not None:
                                parts += [st.amax_history, st.scale]
                        return digest(*parts)
                    case(f"cast {tag}", fp8)
                    case(f"cast+T {tag}", lambda x=x: fp8(x, True))

    # ---- GEMMs --------------------------------------------------------------------------------
    def fp8_pair(recipe, M, N, K, seed, a_role="input", b_role="weight"):
        a = FP8Tensor.from_float(sample(M, K, seed, torch.float32, dev), recipe, a_role)
        b = FP8Tensor.from_float(sample(N, K, seed + 1, torch.float32, dev), recipe, b_role).t()
        return a, b

    big, little = ((512, 384, 1024), (16, 256, 512)) if not small else ((64, 48, 256), (16, 32, 128))
    gemms = [("tensorwise", Current(), "input", "weight"), ("tensorwise e5m2 x e4m3", Current(), "grad", "weight"),
             ("rowwise", Rowwise(), "input", "weight"), ("blockwise", Blockwise(), "input", "weight"),
             ("blockwise wgrad 1x128 x 128x1", Blockwise(), "grad", "input"),
             ("mxfp8", FORMATS["mxfp8"](), "input", "weight")]
    for name, recipe, ra, rb in gemms:
        for (M, N, K) in (big, little):
            a, b = fp8_pair(recipe, M, N, K, 100 + M, ra, rb)
            for fast in (False, True):
                for out_dtype in (torch.bfloat16, torch.float32):
                    case(f"gemm {name} {M}x{N}x{K} fast={fast} {str(out_dtype)[6:]}",
                         lambda a=a, b=b, fast=fast, od=out_dtype: digest(scaled_mm(a, b, od, None, "triton", fast)))
        bias = sample(1, big[1], 9, torch.bfloat16, dev).reshape(-1)
        a, b = fp8_pair(recipe, *big, 200)
        case(f"gemm {name} {big} bias", lambda a=a, b=b, bias=bias: digest(scaled_mm(a, b, torch.bfloat16, bias, "triton")))
    for fmt in ("nvfp4", "mxfp4"):
        recipe = FORMATS[fmt]()
        M, N, K = big
        a = FP4Tensor.from_float(sample(M, K, 300, torch.float32, dev), recipe, "input")
        b = FP4Tensor.from_float(sample(N, K, 301, torch.float32, dev), recipe, "weight").t()
        case(f"gemm {fmt} x {fmt} {big}", lambda a=a, b=b: digest(scaled_mm(a, b, torch.bfloat16, None, "triton")))
        for m in (1, 16):
            x = sample(m, K, 302 + m, torch.bfloat16, dev)
            case(f"gemm weight-only bf16 x {fmt} {m}x{N}x{K}",
                 lambda x=x, b=b: digest(scaled_mm(x, b, torch.bfloat16, None, "triton")))

    # ---- a converted Linear, forward + backward, three steps --------------------------------------
    K, N, T = (1024, 512, 256) if not small else (128, 64, 32)
    for fmt, make in FORMATS.items():
        def linear(make=make):
            torch.manual_seed(0)
            lin = torch.nn.Linear(K, N, bias=True).to(dev, torch.bfloat16)
            layer = lowbit.nn.Linear.from_float(lin, make(), backend="triton", seed=1)
            parts = []
            for step in range(3):
                x = sample(T, K, 400 + step, torch.bfloat16, dev).requires_grad_(True)
                y = layer(x)
                y.backward(sample(T, N, 500 + step, torch.bfloat16, dev))
                parts += [y, x.grad, layer.weight.grad, layer.bias.grad]
                layer.weight.grad = layer.bias.grad = None
            parts += [b for _, b in sorted(layer.named_buffers())]
            return digest(*parts)
        case(f"linear fwd+bwd x3 {fmt}", linear)

    save()
    errors = [k for k, v in out.items() if v.startswith("error")]
    print(f"\n{len(out)} cases, {len(errors)} errors, {time.time() - t0:.0f} s; {path}")


if __name__ == "__main__":
    main()
