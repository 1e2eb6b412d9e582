"""Every kernel lowbit ships: collect the scan specs from ``lowbit.kernels`` and scan them.

Convention: each module under ``lowbit.kernels`` that defines ``@triton.jit`` functions also
defines ``SCAN_SPECS``, a tuple of dicts ``{"kernel": <JITFunction>, "signature": {arg: type},
"constexprs": {name: value}}`` (optional ``num_warps``, ``num_stages``) giving representative
compile configurations. ``collect_specs`` imports every module (import errors are reported, never
swallowed), and lists as *missing* each JIT function defined there that no spec covers. A
``@triton.jit`` helper is covered when a spec'd kernel calls it (directly or through other helpers):
it is inlined into, and so scanned with, that kernel.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import traceback
from typing import Mapping

from .scan import Report, scan

__all__ = ["ShippedSpec", "ShippedScan", "collect_specs", "scan_shipped"]


@dataclasses.dataclass(frozen=True)
class ShippedSpec:
    module: str
    name: str
    kernel: object
    signature: dict
    constexprs: dict
    num_warps: int = 4
    num_stages: int = 3


@dataclasses.dataclass(frozen=True)
class ShippedScan:
    """Specs found, import/spec/compile errors ``(where, message)``, uncovered JIT functions
    ``(module, name)``, and one report per spec."""
    specs: tuple[ShippedSpec, ...]
    errors: tuple[tuple[str, str], ...]
    missing: tuple[tuple[str, str], ...]
    reports: tuple[Report, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors and not self.missing and all(r.clean for r in self.reports)

    def format(self) -> str:
        lines = [f"{len(self.specs)} kernel configuration(s) from lowbit.kernels: "
                 f"{sum(not r.clean for r in self.reports)} with hazards, {len(self.errors)} error(s), "
                 f"{len(self.missing)} JIT function(s) without a scan spec"]
        lines += [f"ERROR {where}: {msg}" for where, msg in self.errors]
        lines += [f"MISSING SCAN_SPECS entry: {mod}.{name}" for mod, name in self.missing]
        for r in self.reports:
            lines.append(("clean   " if r.clean else "HAZARD  ") + r.format())
        return "\n".join(lines)


def _pyfunc(obj):
    """The Python function behind a (possibly autotuned / interpreted) JIT function, else None."""
    for _ in range(8):
        if type(obj).__name__ in ("JITFunction", "InterpretedFunction"):
            fn = getattr(obj, "fn", None)
            return fn if hasattr(fn, "__code__") else None
        obj = getattr(obj, "fn", None)
        if obj is None:
            return None
    return None


def _is_jit(obj) -> bool:
    return type(obj).__name__ in ("JITFunction", "InterpretedFunction", "Autotuner", "Heuristics") \
        and _pyfunc(obj) is not None


def _callees(fn) -> set:
    """Python functions of JIT helpers ``fn`` calls, transitively."""
    out, stack = set(), [fn]
    while stack:
        f = stack.pop()
        for name in f.__code__.co_names:
            val = f.__globals__.get(name)
            if val is not None and _is_jit(val):
                g = _pyfunc(val)
                if g not in out:
                    out.add(g)
                    stack.append(g)
    return out


def _spec(mod_name: str, i: int, entry) -> ShippedSpec:
    if not isinstance(entry, Mapping) or "kernel" not in entry or "signature" not in entry:
        raise ValueError(f"SCAN_SPECS[{i}] must be a dict with 'kernel' and 'signature'")
    if not _is_jit(entry["kernel"]):
        raise ValueError(f"SCAN_SPECS[{i}]['kernel'] is not a @triton.jit function")
    if not isinstance(entry["signature"], Mapping) or not isinstance(entry.get("constexprs", {}), Mapping):
        raise ValueError(f"SCAN_SPECS[{i}]: 'signature' and 'constexprs' must be dicts")
    return ShippedSpec(module=mod_name, name=_pyfunc(entry["kernel"]).__name__, kernel=entry["kernel"],
                       signature=dict(entry["signature"]), constexprs=dict(entry.get("constexprs", {})),
                       num_warps=int(entry.get("num_warps", 4)), num_stages=int(entry.get("num_stages", 3)))


def collect_specs(package: str = "lowbit.kernels") -> ShippedScan:
    """Import every module of ``package``; gather its SCAN_SPECS; list errors and uncovered kernels."""
    errors: list[tuple[str, str]] = []
    try:
        pkg = importlib.import_module(package)
    except Exception as e:  # noqa: BLE001 - reported, not swallowed
        return ShippedScan((), ((package, _short(e)),), ())
    modules = [pkg]
    names = [info.name for info in pkgutil.walk_packages(getattr(pkg, "__path__", []), package + ".",
                                                          onerror=lambda n: errors.append((n, "import failed")))]
    for name in sorted(set(names)):
        try:
            modules.append(importlib.import_module(name))
        except Exception as e:  # noqa: BLE001
            errors.append((name, _short(e)))
    specs: list[ShippedSpec] = []
    seen_specs: set = set()
    defined: dict = {}
    for mod in modules:
        for attr, val in vars(mod).items():
            if _is_jit(val) and _pyfunc(val).__module__ == mod.__name__:
                defined.setdefault(_pyfunc(val), (mod.__name__, _pyfunc(val).__name__))
        entries = getattr(mod, "SCAN_SPECS", None)
        if entries is None:
            continue
        if isinstance(entries, Mapping) or not hasattr(entries, "__iter__"):
            errors.append((mod.__name__, "SCAN_SPECS must be a tuple of dicts"))
            continue
        for i, entry in enumerate(entries):
            try:
                spec = _spec(mod.__name__, i, entry)
            except ValueError as e:
                errors.append((mod.__name__, str(e)))
                continue
            key = (_pyfunc(spec.kernel), repr(sorted(spec.signature.items())),
                   repr(sorted(spec.constexprs.items())), spec.num_warps, spec.num_stages)
            if key not in seen_specs:  # a package re-exporting its modules' SCAN_SPECS lists them twice
                seen_specs.add(key)
                specs.append(spec)
    covered = set()
    for s in specs:
        f = _pyfunc(s.kernel)
        covered.add(f)
        covered |= _callees(f)
    missing = tuple(sorted(v for f, v in defined.items() if f not in covered))
    return ShippedScan(tuple(specs), tuple(errors), missing)


def scan_shipped(package: str = "lowbit.kernels", *, target: str = "sm_90") -> ShippedScan:
    """``collect_specs`` plus a fusion-on scan of every spec (compile errors become errors)."""
    found = collect_specs(package)
    reports, errors = [], list(found.errors)
    for s in found.specs:
        try:
            reports.append(scan(s.kernel, s.signature, s.constexprs, target=target, num_warps=s.num_warps,
                                num_stages=s.num_stages))
        except Exception as e:  # noqa: BLE001
            errors.append((f"{s.module}.{s.name}", _short(e)))
    return dataclasses.replace(found, errors=tuple(errors), reports=tuple(reports))


def _short(e: BaseException) -> str:
    lines = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()
    last = lines[-1] if lines else ""
    return (last if last.startswith(type(e).__name__) else f"{type(e).__name__}: {last}")[:500]
