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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lowbit", description="numerics-aware low-precision training")
    parser.add_argument("--version", action="version", version=f"lowbit {_version()}")
    sub = parser.add_subparsers(dest="command")
    _add_formats(sub)
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
