"""Host (CPU) time of a converted Linear on the 85M-parameter HF Llama, and the eager step it costs.

    python3 benchmarks/host_overhead.py --out DIR [--steps 20] [--format fp8]     (~1-2 min on an H200)

The model: ``transformers.LlamaForCausalLM`` from config (hidden 768, 8 layers, 12 heads,
intermediate 2048, vocab 32000, tied embeddings: ~81M parameters), bf16, random tokens, batch
32 x 512; the step: forward, cross-entropy loss, backward, fused AdamW, zero_grad. Measured in one
run: the eager step time of the bf16 model (the anchor) and of the same model converted by
``lowbit.convert(model, fmt, filter=...)`` (every Linear but the output head: the size rule, which
keeps this model's layers in bf16 on Hopper, is overridden, so the host path is measured), by CUDA events over
``--steps`` steps after warm-up; then ``torch.profiler`` (CPU activity) over 5 converted steps:
per call of the Linear's autograd function, its self CPU time (the Python of the forward or the
backward: plans, launches, tensor wrappers; the aten ops it calls are children) and its total CPU
time. Rows to ``DIR/results.csv``; a table last.
"""
from __future__ import annotations

import copy
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.common import append_results, env_info, parse_args, print_table, result_row, write_json  # noqa: E402

SHAPE = "HF Llama 85M (d768, 8 layers), 32x512 tokens"


def build():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=768, num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=12,
                      intermediate_size=2048, vocab_size=32000, max_position_embeddings=512, tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)


def trainer(model, tokens):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step():
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def step_ms(step, steps: int) -> float:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def linear_host_us(step, calls: int = 5) -> dict:
    """{"forward"/"backward": (self CPU us a call, total CPU us a call, calls)} of the converted
    Linears' autograd functions over ``calls`` steps."""
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if "_FP8Linear" not in e.key and "_FP4Linear" not in e.key:
            continue
        phase = "backward" if "Backward" in e.key else "forward"
        self_us, total_us, n = out.get(phase, (0.0, 0.0, 0))
        out[phase] = (self_us + e.self_cpu_time_total, total_us + e.cpu_time_total, n + e.count)
    return {k: (s / n, t / n, n) for k, (s, t, n) in out.items() if n}


def main():
    def extra(p):
        p.add_argument("--steps", type=int, default=20)
        p.add_argument("--format", default="fp8")
    args = parse_args(__doc__.splitlines()[0], extra)
    if not torch.cuda.is_available():
        print("benchmarks/host_overhead.py needs a CUDA GPU; none found (nothing was measured).")
        return 2
    import lowbit
    t0 = time.time()
    env = env_info()
    base = build()
    tokens = torch.randint(0, 32000, (32, 512), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    low = lowbit.convert(copy.deepcopy(base), args.format, filter=lambda name, mod: not name.endswith("lm_head"))
    bf16_ms = step_ms(trainer(base, tokens), args.steps)
    low_step = trainer(low, tokens)
    low_ms = step_ms(low_step, args.steps)
    host = linear_host_us(low_step)
    rows = [result_row(env, "train step", SHAPE, "bf16 eager", "ms", bf16_ms),
            result_row(env, "train step", SHAPE, f"lowbit {args.format} eager", "ms", low_ms, "bf16 eager",
                       bf16_ms / low_ms)]
    table = [dict(what="bf16 eager step", value=bf16_ms, unit="ms"),
             dict(what=f"lowbit {args.format} eager step", value=low_ms, unit="ms", ratio=bf16_ms / low_ms)]
    for phase, (self_us, total_us, n) in sorted(host.items()):
        rows.append(result_row(env, "host_overhead (profiler, self CPU)", SHAPE,
                               f"lowbit {args.format} Linear {phase}", "host us a call", self_us))
        rows.append(result_row(env, "host_overhead (profiler, total CPU)", SHAPE,
                               f"lowbit {args.format} Linear {phase}", "host us a call", total_us))
        table += [dict(what=f"Linear {phase}, self CPU", value=self_us, unit=f"us a call ({n} calls)"),
                  dict(what=f"Linear {phase}, total CPU", value=total_us, unit="us a call")]
    if len(host) == 2:
        both = sum(v[0] for v in host.values())
        rows.append(result_row(env, "host_overhead (profiler, self CPU)", SHAPE,
                               f"lowbit {args.format} Linear forward + backward", "host us a call", both,
                               "target 60 us", 60.0 / both))
        table.append(dict(what="Linear forward + backward, self CPU", value=both, unit="us (target <= 60)"))
    append_results(rows, args.out)
    write_json(args.out, "host_overhead", {"env": env, "rows": rows, "wall_s": time.time() - t0})
    print(env)
    print_table(table, ["what", "value", "unit", "ratio"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
