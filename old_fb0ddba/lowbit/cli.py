"""The ``lowbit`` command: ``lowbit --version``, ``lowbit formats``; later issues add ``audit`` and ``demo``.

Each subcommand is a function ``_add_<name>(subparsers)`` that registers its parser and sets
``func``; heavy imports happen inside the handler, never at import time.
"""
from __future__ import annotations

import argparse
import sys


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
    p.add_argument("--all", action="store_true", help="scan every kernel lowbit ships (lowbit.kernels SCAN_SPECS)")
    p.add_argument("--package", default="lowbit.kernels",
                   help="with --all: the package whose modules' SCAN_SPECS are scanned (default lowbit.kernels)")
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


def _add_audit(sub) -> None:
    p = sub.add_parser("audit", help="numerics audits (fma: FMA-contraction hazards in Triton kernels)")
    audit_sub = p.add_subparsers(dest="audit_command")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    _add_audit_fma(audit_sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lowbit", description="numerics-aware low-precision training")
    parser.add_argument("--version", action="version", version=f"lowbit {_version()}")
    sub = parser.add_subparsers(dest="command")
    _add_formats(sub)
    _add_demo(sub)
    _add_audit(sub)
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
