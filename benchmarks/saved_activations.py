"""Bytes a compiled training step keeps for its backward: bf16, lowbit formats and torchao float8.

    python3 benchmarks/saved_activations.py --out DIR [--formats fp8,fp8-block] [--torchao tensorwise]

An HF Llama from config (d512, 2 layers, 2x256 tokens; ``--hidden/--layers/--tokens``), every Linear
but the head converted, compiled by AOT autograd with the min-cut partitioner that inductor uses and
no code generation, so it runs on the CPU as on a GPU and times nothing. The saved values are the
backward graph's inputs other than parameters and output gradients, summed in bytes (shape x
element size of their fake tensors) and grouped by dtype. What it explains: the peak memory of
``benchmarks/step.py``, where a lowbit step keeps more than torchao's.
Rows: "saved MiB" per variant, with the ratio to bf16; the table prints last.
"""
from __future__ import annotations

import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.common import append_results, env_info, guarded, parse_args, print_table, result_row  # noqa: E402


def saved_backend(saved: list):
    """A torch.compile backend (AOT autograd, min-cut partitioner, no code generation) that appends
    ``(dtype, shape, bytes)`` of every value the backward graph takes, parameters and output
    gradients aside, to ``saved``."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def bw(gm, example_inputs):
        for n in gm.graph.nodes:
            v = n.meta.get("val")
            if n.op == "placeholder" and not n.name.startswith(("tangents", "primals")) and \
                    isinstance(v, torch.Tensor):
                saved.append((v.dtype, tuple(v.shape), v.numel() * v.element_size()))
        return make_boxed_func(gm.forward)
    return aot_autograd(fw_compiler=lambda gm, ex: make_boxed_func(gm.forward), bw_compiler=bw,
                        partition_fn=min_cut_rematerialization_partition)


def _model(args, variant: str, device: str):
    import transformers

    import lowbit
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                                   num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                                   num_key_value_heads=max(1, args.hidden // 128), vocab_size=1024,
                                   max_position_embeddings=args.tokens)
    model = transformers.LlamaForCausalLM(cfg).to(device, torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if variant.startswith("torchao "):
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
            convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(variant.split()[1]),
                                       module_filter_fn=lambda mod, fqn: fqn != "lm_head")
        elif variant != "bf16":
            lowbit.convert(model, variant.split()[1], filter=lambda name, mod: name != "lm_head")
    return model


def measure(args, variant: str, device: str) -> dict:
    model = _model(args, variant, device)
    saved: list = []
    torch._dynamo.reset()
    step = torch.compile(model, backend=saved_backend(saved))
    ids = torch.randint(0, 1024, (2, args.tokens), device=device)
    step(input_ids=ids, labels=ids).loss.backward()
    by_dtype: dict = {}
    for dtype, _, n in saved:
        name = str(dtype).replace("torch.", "")
        by_dtype[name] = by_dtype.get(name, 0) + n
    return {"variant": variant, "saved MiB": sum(by_dtype.values()) / 2 ** 20, "tensors": len(saved),
            "by dtype (MiB)": ", ".join(f"{k} {v / 2 ** 20:.2f}" for k, v in sorted(by_dtype.items(), key=lambda kv: -kv[1]))}


def main():
    def extra(p):
        p.add_argument("--formats", default="fp8,fp8-block,mxfp8,nvfp4", help="lowbit formats")
        p.add_argument("--torchao", default="tensorwise,rowwise", help="torchao float8 recipes ('' for none)")
        p.add_argument("--hidden", type=int, default=512)
        p.add_argument("--layers", type=int, default=2)
        p.add_argument("--tokens", type=int, default=256, help="tokens a sequence (batch 2)")
    args = parse_args(__doc__.splitlines()[0], extra)
    env = env_info()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    variants = ["bf16"] + [f"lowbit {f}" for f in args.formats.split(",") if f] + \
        [f"torchao {r}" for r in args.torchao.split(",") if r]
    shape = f"HF Llama d{args.hidden}, {args.layers} layers, 2x{args.tokens} tokens, compiled (min-cut)"
    rows, csv = [], []
    for v in variants:
        r = guarded(rows, v, lambda v=v: measure(args, v, device))
        if r is not None:
            rows.append(r)
    base = next((r["saved MiB"] for r in rows if r.get("variant") == "bf16"), None)
    for r in rows:
        if "saved MiB" in r:
            r["vs bf16"] = r["saved MiB"] / base if base else None
            csv.append(result_row(env, "saved for backward", shape, r["variant"], "saved MiB", r["saved MiB"],
                                  "bf16" if r["variant"] != "bf16" else "", r["vs bf16"] if r["variant"] != "bf16" else None))
    if csv:
        print("results:", append_results(csv, args.out))
    print(f"\n{shape} on {device}")
    print_table(rows, ["variant", "saved MiB", "vs bf16", "tensors", "by dtype (MiB)", "error"])


if __name__ == "__main__":
    main()
