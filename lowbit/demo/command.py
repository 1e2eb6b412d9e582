"""``lowbit demo [--formats fp8,nvfp4] [--size tiny|small|50m] [--steps N] [--seeds N] [--out DIR]
[--monitor]``: train the demo GPT in the baseline and each format (each run watched by
``lowbit.monitor`` with ``--monitor``, its JSON lines in ``--out``), print the table last, write ``demo.json`` and
``demo_loss.png`` into ``--out`` (default: the current folder).

Bad values are argparse errors (one line naming the value and the choices, exit status 2): every
value is checked before any training starts, the output folder included. The first line says what
is compared (the baseline and why) and the second where the files go; ``--size 50m`` on a CPU
warns on stderr that it is sized for one GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .model import SIZES

__all__ = ["add_arguments", "run"]


def _arg_type(check, name: str):
    """An argparse ``type`` from a check that raises ValueError: its message becomes the error."""
    def parse(text):
        try:
            return check(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = name
    return parse


def _positive(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{text!r} is not a positive integer")
    return int(text)


def add_arguments(p) -> None:
    from ..convert import FORMATS
    from ..kernels.registry import BACKENDS
    from .train import BASELINES, check_device, check_formats
    positive = _arg_type(_positive, "positive integer")
    p.add_argument("--formats", default=("fp8",), type=_arg_type(lambda t: check_formats(t.split(",")), "formats"),
                   help=f"comma-separated formats to compare with the baseline ({', '.join(FORMATS)}; default fp8)")
    p.add_argument("--size", default="tiny", choices=list(SIZES),
                   help="tiny (CPU, under 2 min), small, 50m (one GPU)")
    p.add_argument("--steps", type=positive, help="training steps (default: 150 tiny, 400 small, 1000 50m)")
    p.add_argument("--batch", type=positive, help="sequences per step")
    p.add_argument("--device", type=_arg_type(check_device, "device"), help="cpu or cuda (default: cuda if available)")
    p.add_argument("--baseline", choices=BASELINES, help="default: bf16 on CUDA, fp32 on the CPU")
    p.add_argument("--backend", default="auto", choices=["auto", *BACKENDS.names()],
                   help="lowbit GEMM backend (default auto)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=positive, default=1,
                   help="train every format from seeds SEED..SEED+N-1 and average")
    p.add_argument("--out", default=".", help="folder for demo.json and demo_loss.png")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--eager", action="store_true", help="CUDA: eager steps instead of CUDA-graph replay")
    p.add_argument("--monitor", action="store_true",
                   help="watch every run with lowbit.monitor: JSON lines in --out, its report after the table")


def _compared(cfg, asked_baseline) -> str:
    on_cuda = cfg.device.startswith("cuda")
    why = ("--baseline" if asked_baseline else "the CUDA default" if on_cuda else
           "the CPU default: bf16 matmuls are emulated and slow there; --baseline bf16 forces it")
    return (f"lowbit demo: {cfg.size} GPT, {cfg.steps} steps on {cfg.device}: {', '.join(cfg.formats)} "
            f"against a {cfg.baseline} baseline ({why})")


def run(args) -> int:
    from . import train
    from .report import plot, table
    out = os.path.abspath(args.out)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        print(f"lowbit demo: error: --out {args.out}: cannot create the folder ({e.strerror})", file=sys.stderr)
        return 2
    cfg = train.DemoConfig(formats=args.formats, size=args.size, steps=args.steps, batch=args.batch,
                           seed=args.seed, seeds=args.seeds, device=args.device, backend=args.backend,
                           baseline=args.baseline, progress=not args.no_progress,
                           graph=False if args.eager else None,
                           monitor=out if args.monitor else None).resolved()
    png, js = os.path.join(out, "demo_loss.png"), os.path.join(out, "demo.json")
    print(_compared(cfg, args.baseline is not None))
    print(f"lowbit demo: writes {js} and {png}")
    if cfg.size == "50m" and not cfg.device.startswith("cuda"):
        print("lowbit demo: warning: --size 50m is sized for one GPU; on the CPU it trains for hours "
              "(--size tiny is the CPU demo)", file=sys.stderr)
    sys.stdout.flush()
    result = train.run_demo(cfg)
    result["png_writer"] = plot(result, png)
    with open(js, "w") as fh:
        json.dump(result, fh)
    print(f"wrote {js}" + (f" and {png} ({result['png_writer']})" if result["png_writer"] else
                           "; no PNG: no run finished"))
    print(table(result))
    for r in result["runs"]:
        if r.get("monitor"):
            print(f"\n[{r['format']}] {r['monitor']['report']}")
    return 1 if any(r.get("error") for r in result["runs"]) else 0
