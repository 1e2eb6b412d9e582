"""``lowbit demo [--formats fp8,nvfp4] [--size tiny|small|50m] [--steps N] [--seeds N] [--out DIR]``: train the
demo GPT in the baseline and each format, print the table last, write ``demo.json`` and
``demo_loss.png`` into ``--out`` (default: the current folder)."""
from __future__ import annotations

import json
import os

from .model import SIZES

__all__ = ["add_arguments", "run"]


def add_arguments(p) -> None:
    from ..convert import FORMATS
    p.add_argument("--formats", default="fp8",
                   help=f"comma-separated formats to compare with the baseline ({', '.join(FORMATS)}; default fp8)")
    p.add_argument("--size", default="tiny", choices=sorted(SIZES),
                   help="tiny (CPU, under 2 min), small, 50m (one GPU)")
    p.add_argument("--steps", type=int, help="training steps (default: 150 tiny, 400 small, 1000 50m)")
    p.add_argument("--batch", type=int, help="sequences per step")
    p.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    p.add_argument("--baseline", choices=("bf16", "fp32"), help="default: bf16 on CUDA, fp32 on the CPU")
    p.add_argument("--backend", default="auto", help="lowbit GEMM backend (default auto)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=1, help="train every format from seeds SEED..SEED+N-1 and average")
    p.add_argument("--out", default=".", help="folder for demo.json and demo_loss.png")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--eager", action="store_true", help="CUDA: eager steps instead of CUDA-graph replay")


def run(args) -> int:
    from .report import plot, table
    from .train import DemoConfig, run_demo
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    cfg = DemoConfig(formats=formats, size=args.size, steps=args.steps, batch=args.batch, seed=args.seed,
                     seeds=args.seeds, device=args.device, backend=args.backend, baseline=args.baseline,
                     progress=not args.no_progress, graph=False if args.eager else None)
    result = run_demo(cfg)
    os.makedirs(args.out, exist_ok=True)
    png = os.path.join(args.out, "demo_loss.png")
    result["png_writer"] = plot(result, png)
    with open(os.path.join(args.out, "demo.json"), "w") as fh:
        json.dump(result, fh)
    print(f"wrote {png} ({result['png_writer']}) and {os.path.join(args.out, 'demo.json')}")
    print(table(result))
    return 1 if any(r.get("error") for r in result["runs"]) else 0
