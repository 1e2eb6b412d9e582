"""The ``lowbit`` command: ``lowbit --version``, ``formats``, ``demo``, ``audit fma | kernels | model |
hardware``, ``replay``, ``monitor plot``.

Each subcommand is a function ``_add_<name>(subparsers)`` that registers its parser and sets
``func``; heavy imports happen inside the handler, never at import time. A bad command line is
one line on stderr, ``lowbit <command>: error: <the bad value and the choices>``, and exit
status 2 (argparse's ``SystemExit(2)``; no usage block: ``--help`` prints that).
"""
from __future__ import annotations

import argparse
import sys


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (subcommand parsers are made of the same class)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("lowbit")
    except PackageNotFoundError:  # running from a source tree
        return "0.1.0+src"


def _cmd_formats(args) -> int:
    from .dtypes.formats import FORMATS
    cols = ("name", "bits", "E", "M", "bias", "max", "min normal", "min subnormal", "inf", "NaN", "torch dtype")
    rows = []
    for f in FORMATS.values():
        rows.append((f.name, str(f.nbits), str(f.ebits), str(f.mbits), str(f.bias), f"{f.max:.6g}",
                     f"{f.min_normal:.6g}", f"{f.min_subnormal:.6g}",
                     "-" if f.inf_code is None else f"0x{f.inf_code:02x}",
                     "-" if f.nan_code is None else f"0x{f.nan_code:02x}", f.torch_dtype_name or "-"))
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    return 0


def _add_formats(sub) -> None:
    p = sub.add_parser("formats", help="print the table of low-precision formats")
    p.set_defaults(func=_cmd_formats)


def _cmd_demo(args) -> int:
    from .demo.command import run
    return run(args)


def _add_demo(sub) -> None:
    from .demo.command import add_arguments
    p = sub.add_parser("demo", help="train a small byte-level GPT in bf16/fp32 vs low-precision formats, compare")
    add_arguments(p)
    p.set_defaults(func=_cmd_demo)


def _cmd_audit_fma(args) -> int:
    from .fma_guard.cli import run_audit_fma
    return run_audit_fma(args)


def _add_audit_fma(audit_sub) -> None:
    p = audit_sub.add_parser(
        "fma", help="scan Triton kernels for FMA-contraction hazards (compiled for a GPU target, no GPU needed)",
        description="Compile a Triton kernel for sm_90 on the CPU and judge its PTX for FMA-contraction hazards "
                    "(exit 0 clean, 1 hazard found, 2 could not scan).")
    p.add_argument("kernel", nargs="?", metavar="FILE.py:KERNEL", help="the kernel to scan")
    p.add_argument("--all", action="store_true", help="scan every kernel lowbit ships (lowbit.kernels SCAN_SPECS and "
                                                      "the Gluon kernels of lowbit.fma_guard.gluon.GLUON_SPECS)")
    p.add_argument("--package", default="lowbit.kernels",
                   help="with --all: the package (or module) whose kernels are scanned (default lowbit.kernels)")
    p.add_argument("--signature", help='argument types: "X=*fp32,Y=*fp32,s=fp32", or positional "*fp32,*fp32,fp32" '
                                       "for the non-constexpr parameters in order (default: the file's SCAN_SPECS)")
    p.add_argument("--constexpr", action="append", default=[], metavar="NAME=VALUE",
                   help="a constexpr value (repeatable), e.g. --constexpr BLOCK=256")
    p.add_argument("--arch", default="sm_90", help="GPU target (default sm_90)")
    p.add_argument("--num-warps", type=int, default=4)
    p.add_argument("--no-fusion", action="store_true",
                   help="scan the kernel as compiled with enable_fp_fusion=False (what lowbit.fma_guard.guard launches)")
    p.add_argument("--explain", action="store_true", help="print an exact (mpmath) counterexample per finding")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_audit_fma)


def _cmd_audit_kernels(args) -> int:
    from .validate.cli import run_audit_kernels
    return run_audit_kernels(args)


def _add_audit_kernels(audit_sub) -> None:
    p = audit_sub.add_parser(
        "kernels", help="every shipped kernel against exact (mpmath) references: max ULP / bound ratio, pass/fail",
        description="Run lowbit's casts and GEMMs (Triton natively on a GPU, in Triton's interpreter on the CPU, "
                    "and the torch emulation) on random and adversarial inputs against exact references "
                    "(exit 0 all passed, 1 a check failed).")
    p.add_argument("--quick", action="store_true", help="small shapes only (what CI runs)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_audit_kernels)


def _cmd_audit_model(args) -> int:
    from .validate.cli import run_audit_model
    return run_audit_model(args)


def _add_audit_model(audit_sub) -> None:
    p = audit_sub.add_parser(
        "model", help="per-layer SQNR (worst channel too), saturation and a recommended format of a model",
        description="One forward and backward of the model per format against a float64 copy: per Linear "
                    "layer the SQNR of its output (and worst output channel), input and weight gradients, "
                    "overflow/underflow fractions, ranked worst first, with a recommended format "
                    "(exit 0 done, 2 could not run).")
    p.add_argument("model", metavar="MODULE:FACTORY", help="a function returning the model (FILE.py:NAME too)")
    p.add_argument("--batch", metavar="MODULE:FN", help="a function returning the batch: a tensor, a tuple of "
                   "positional args or a dict of keyword args (default: make_batch next to the factory, else "
                   "N(0, 1) rows for the first Linear)")
    p.add_argument("--formats", help="comma-separated lowbit.convert formats (default: "
                   "fp8,fp8-rowwise,fp8-block,mxfp8,mxfp4,nvfp4)")
    p.add_argument("--threshold", type=float, default=15.0,
                   help="SQNR (dB) a format must keep (worst output channel, both gradients) for a layer to be "
                        "recommended it (default 15)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_audit_model)


def _cmd_audit_hardware(args) -> int:
    from .validate.cli import run_audit_hardware
    return run_audit_hardware(args)


def _add_audit_hardware(audit_sub) -> None:
    p = audit_sub.add_parser(
        "hardware", help="the GPU's tensor-core accumulator, measured (bits kept, FP32 promotion interval)",
        description="Measure with crafted dot products how many bits the FP8 and bf16 tensor-core dot keeps and "
                    "whether lowbit's and cuBLAS's FP8 GEMMs promote to FP32 (exit 0 done, 2 no CUDA GPU).")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_audit_hardware)


def _add_audit(sub) -> None:
    p = sub.add_parser("audit", help="numerics audits: fma (FMA-contraction hazards), kernels, model, hardware")
    audit_sub = p.add_subparsers(dest="audit_command")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    _add_audit_fma(audit_sub)
    _add_audit_kernels(audit_sub)
    _add_audit_model(audit_sub)
    _add_audit_hardware(audit_sub)


def _cmd_replay(args) -> int:
    from .monitor.flight import replay
    print(replay(args.file, args.device))
    return 0


def _add_replay(sub) -> None:
    p = sub.add_parser("replay", help="re-run the module a flight record holds in float64 and in its format",
                       description="Replay a lowbit.monitor flight record (flight=PATH): run the culprit module as "
                                   "recorded and in float64, and show where they part (which op, which elements). "
                                   "The file is a pickle: replay only files you trust.")
    p.add_argument("file", help="the flight record (.pt)")
    p.add_argument("--device", default="cpu",
                   help="where to replay (default cpu: lowbit layers run the exact emulation)")
    p.set_defaults(func=_cmd_replay)


def _cmd_monitor_plot(args) -> int:
    from .monitor.plot import plot
    out = args.out or (args.file.rsplit(".", 1)[0] + ".png")
    print(f"wrote {plot(args.file, out, args.top)}")
    return 0


def _add_monitor(sub) -> None:
    p = sub.add_parser("monitor", help="lowbit.monitor logs (plot: PNG of a JSON lines log)")
    monitor_sub = p.add_subparsers(dest="monitor_command")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    q = monitor_sub.add_parser("plot", help="PNG of amax and scale over steps, and overflow/underflow per layer")
    q.add_argument("file", help="the JSON lines log (lowbit.monitor(model, log=PATH))")
    q.add_argument("--out", help="the PNG (default: FILE with .png)")
    q.add_argument("--top", type=int, default=12, help="casts shown (the worst by saturated + flushed fraction)")
    q.set_defaults(func=_cmd_monitor_plot)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lowbit", description="numerics-aware low-precision training")
    parser.add_argument("--version", action="version", version=f"lowbit {_version()}")
    sub = parser.add_subparsers(dest="command")
    _add_formats(sub)
    _add_demo(sub)
    _add_audit(sub)
    _add_replay(sub)
    _add_monitor(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
