"""``lowbit audit fma``: scan one kernel of a user's file, or every kernel lowbit ships.

Exit status: 0 clean, 1 a hazard was found, 2 the request could not be carried out (bad
arguments, a file or kernel that does not load, a kernel without a signature, a shipped module that
fails to import or lacks a scan spec).
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys

__all__ = ["run_audit_fma", "parse_signature", "parse_constexprs", "load_kernel"]


class UsageError(Exception):
    """A request the command cannot carry out (exit status 2)."""


def parse_constexprs(items) -> dict:
    """``["N=1024", "DTYPE=tl.float16", "FLAG=True"]`` -> ``{"N": 1024, ...}``."""
    out = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip().isidentifier():
            raise UsageError(f"--constexpr {item!r}: expected NAME=VALUE")
        value = value.strip()
        if value.startswith("tl."):
            import triton.language as tl
            if not hasattr(tl, value[3:]):
                raise UsageError(f"--constexpr {item!r}: triton.language has no {value[3:]!r}")
            out[name.strip()] = getattr(tl, value[3:])
            continue
        try:
            out[name.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise UsageError(f"--constexpr {item!r}: {value!r} is not a Python literal") from None
    return out


def parse_signature(text: str, jit, constexprs: dict) -> dict:
    """``"X=*fp32,Y=*fp32,s=fp32"`` (or ``X:*fp32``), or positional ``"*fp32,*fp32,fp32"`` over the
    parameters that are not constexpr, in order."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError("--signature is empty")
    named = [("=" in t or ":" in t) for t in items]
    if all(named):
        out = {}
        for t in items:
            sep = "=" if "=" in t else ":"
            name, _, ty = t.partition(sep)
            out[name.strip()] = ty.strip()
        return out
    if any(named):
        raise UsageError("--signature: use either NAME=TYPE items or positional TYPE items, not both")
    params = [p.name for p in jit.params if not p.is_constexpr and p.name not in constexprs]
    if len(items) != len(params):
        raise UsageError(f"--signature has {len(items)} types for {len(params)} non-constexpr parameters "
                         f"{params}")
    return dict(zip(params, items))


def load_kernel(spec: str):
    """``path/to/file.py:kernel`` -> (module, kernel object)."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise UsageError(f"{spec!r}: expected FILE.py:KERNEL")
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    mod_name = "lowbit_audit_" + os.path.splitext(os.path.basename(path))[0]
    spec_ = importlib.util.spec_from_file_location(mod_name, path)
    if spec_ is None or spec_.loader is None:
        raise UsageError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec_)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        spec_.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file; report it
        raise UsageError(f"{path}: import failed: {type(e).__name__}: {e}") from None
    finally:
        sys.path.pop(0)
    if not hasattr(module, name):
        raise UsageError(f"{path}: no kernel named {name!r}")
    return module, getattr(module, name)


def _configs(module, kernel, args) -> list[tuple[dict, dict, int]]:
    from .compile import as_jit_function
    from .shipped import _pyfunc
    try:
        jit = as_jit_function(kernel)
    except TypeError as e:
        raise UsageError(str(e)) from None
    cx = parse_constexprs(args.constexpr)
    if args.signature:
        return [(parse_signature(args.signature, jit, cx), cx, args.num_warps)]
    target = _pyfunc(kernel)
    specs = [s for s in getattr(module, "SCAN_SPECS", ()) or ()
             if isinstance(s, dict) and _pyfunc(s.get("kernel")) is target]
    if not specs:
        raise UsageError(f"{jit.__name__}: give --signature (and --constexpr), or list it in the file's SCAN_SPECS")
    return [(dict(s["signature"]), {**dict(s.get("constexprs", {})), **cx}, int(s.get("num_warps", args.num_warps)))
            for s in specs]


def run_audit_fma(args) -> int:
    """Handler of ``lowbit audit fma``."""
    try:
        if args.all == bool(args.kernel):
            raise UsageError("give exactly one of FILE.py:KERNEL or --all")
        if args.all:
            return _audit_all(args)
        return _audit_one(args)
    except UsageError as e:
        print(f"lowbit audit fma: {e}", file=sys.stderr)
        return 2


def _audit_all(args) -> int:
    from .shipped import scan_shipped
    res = scan_shipped(args.package, target=args.arch)
    if args.json:
        print(json.dumps({"reports": [r.to_dict() for r in res.reports], "errors": res.errors,
                          "missing": res.missing}, indent=1, default=str))
    else:
        print(res.format())
        if args.explain:
            _print_explanations([f for r in res.reports for f in r.findings])
    if res.errors or res.missing:
        return 2
    return 0 if all(r.clean for r in res.reports) else 1


def _audit_one(args) -> int:
    from .scan import scan
    module, kernel = load_kernel(args.kernel)
    reports = []
    for sig, cx, num_warps in _configs(module, kernel, args):
        try:
            reports.append(scan(kernel, sig, cx, target=args.arch, enable_fp_fusion=not args.no_fusion,
                                num_warps=num_warps))
        except (ValueError, TypeError) as e:
            raise UsageError(str(e)) from None
        except Exception as e:  # noqa: BLE001 - a compile error in the user's kernel
            raise UsageError(f"compile failed: {type(e).__name__}: {str(e).strip().splitlines()[-1:]}") from None
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=1, default=str))
    else:
        for r in reports:
            print(r.format())
        if args.explain:
            _print_explanations([f for r in reports for f in r.findings])
    return 0 if all(r.clean for r in reports) else 1


def _print_explanations(findings) -> None:
    from .explain import explain
    for f in findings:
        print(f"\nexact counterexample for {f.source}:")
        print(explain(f).format())
