"""Bytes ``lowbit.monitor`` reads in one training step, by kind of row, eager and compiled.

    python3 benchmarks/monitor_bytes.py --out DIR [--layers 2] [--hidden 256]

CPU, times nothing: what the stats kernels read on the GPU is the elements the records count
(the ``numel`` column of the step's buffers, summed before ``mon.step()``), two bytes each in a
bf16 model. The model is an HF Llama with Llama-3-8B proportions at a small width (``--hidden``
d; FFN 3.5 d, vocab 31.3 d, 4 query heads per KV head, 2 x d tokens), so every tensor the monitor
reads is the product of two sizes proportional to d: the bytes at the 8B shape (d 4096, 2 x 4096
tokens) are these times ``(4096 / d)^2``. Eager, the monitor skips a tensor it recorded a moment
ago (``Session.seen``); compiled (``torch.compile``, inductor on the CPU) it reads every row.
Rows: GB a step at the 8B shape per mode, in all and by kind (forward outputs, gradients,
parameter gradients; the LM head, embedding and final norm apart from the decoder layers).
"""
from __future__ import annotations

import os
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from benchmarks.common import append_results, env_info, parse_args, print_table, result_row  # noqa: E402

HEAD_PARTS = ("lm_head", "embed_tokens", "model.norm", "model", "")


def llama(layers: int, d: int):
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=round(d * 128256 / 4096), hidden_size=d, intermediate_size=d * 7 // 2,
                                   num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
                                   max_position_embeddings=d, use_cache=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)


def kind(site) -> str:
    where = "head" if site.module in HEAD_PARTS or site.module.endswith(("lm_head", "embed_tokens")) else "layers"
    what = {"output": "outputs", "input": "inputs", "grad_output": "gradients", "grad_input": "gradients"}
    return f"{where} {what.get(site.tensor, 'parameter gradients' if site.phase == 'backward' else 'parameters')}"


def step_bytes(layers: int, d: int, compiled: bool) -> dict:
    """Bytes read in the second monitored step, in all and by ``kind``."""
    import lowbit
    from lowbit.monitor.stats import COL
    torch._dynamo.reset()
    model = llama(layers, d)
    ids = torch.randint(0, model.config.vocab_size, (2, d), generator=torch.Generator().manual_seed(1))  # 2 x d tokens
    fn = torch.compile(model) if compiled else model
    mon = lowbit.monitor(fn, on_anomaly="record")
    out = {}
    for s in range(2):
        model.zero_grad(set_to_none=True)
        fn(input_ids=ids, labels=ids).loss.backward()
        if s == 1:
            numel = mon.stats[:-1, COL["numel"]] + mon.bstats[:-1, COL["numel"]]
            for site, n in zip(mon.layout.sites, numel.tolist()):
                out[kind(site)] = out.get(kind(site), 0.0) + 2 * n
        mon.step()
    mon.detach()
    out["all"] = sum(out.values())
    return out


def main():
    def extra(p):
        p.add_argument("--layers", type=int, default=2)
        p.add_argument("--hidden", type=int, default=256)
    args = parse_args(__doc__, extra)
    env = env_info()
    scale = (4096 / args.hidden) ** 2 / 1e9
    shape = f"{args.layers} layers of Llama-3-8B shape, 2x4096 tokens, bf16 (counted at d{args.hidden}, x{scale * 1e9:.0f})"
    rows, csv = [], []
    for mode in ("eager", "compiled"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = step_bytes(args.layers, args.hidden, mode == "compiled")
        row = {"mode": mode, **{k: v * scale for k, v in sorted(got.items())}}
        rows.append(row)
        for k, v in got.items():
            csv.append(result_row(env, "lowbit.monitor bytes read a step", shape, f"{mode}, {k}", "GB", v * scale))
    append_results(csv, args.out)
    print(env)
    print_table(rows, sorted({k for r in rows for k in r}, key=lambda k: (k != "mode", k != "all", k)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
