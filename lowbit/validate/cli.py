"""Handlers of ``lowbit audit kernels | model | hardware`` (``lowbit/cli.py`` registers the parsers).

Exit status: ``kernels``: 0 every check passed, 1 a check failed; ``model``: 0 done; ``hardware``:
0 done; all: 2 the request could not be carried out (bad arguments, a module or factory that does
not load, no GPU for ``hardware``).

``audit kernels`` on a machine without a GPU runs the Triton kernels in Triton's interpreter, which
``@triton.jit`` chooses when lowbit is imported: without ``TRITON_INTERPRET=1`` in the environment
the command runs itself again in a child Python with it set.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys

__all__ = ["run_audit_kernels", "run_audit_model", "run_audit_hardware", "load_callable"]


class UsageError(Exception):
    """A request the command cannot carry out (exit status 2)."""


def _err(cmd: str, msg: str) -> int:
    print(f"lowbit audit {cmd}: {msg}", file=sys.stderr)
    return 2


# ---- kernels -----------------------------------------------------------------------------------------
def run_audit_kernels(args) -> int:
    import torch
    from ..kernels.triton.runtime import interpreting
    if not torch.cuda.is_available() and not interpreting():
        argv = ["audit", "kernels"] + (["--quick"] if args.quick else []) + (["--json"] if args.json else [])
        env = dict(os.environ, TRITON_INTERPRET="1")
        return subprocess.run([sys.executable, "-m", "lowbit.cli", *argv], env=env).returncode
    from .kernel_audit import audit_kernels
    from .progress import progress_bar
    res = audit_kernels(quick=args.quick, progress=progress_bar("audit kernels"))
    print(res.to_json() if args.json else res.format())
    return 0 if res.passed else 1


# ---- model -------------------------------------------------------------------------------------------
def load_callable(spec: str, what: str):
    """``package.module:NAME`` or ``path/to/file.py:NAME`` -> the object."""
    mod_name, sep, name = spec.rpartition(":")
    if not sep or not mod_name or not name:
        raise UsageError(f"{what} {spec!r}: expected MODULE:NAME (or FILE.py:NAME)")
    try:
        if mod_name.endswith(".py") or os.sep in mod_name:
            if not os.path.isfile(mod_name):
                raise UsageError(f"{what} {spec!r}: {mod_name}: no such file")
            s = importlib.util.spec_from_file_location("lowbit_audit_" + os.path.basename(mod_name)[:-3], mod_name)
            module = importlib.util.module_from_spec(s)
            sys.path.insert(0, os.path.dirname(os.path.abspath(mod_name)))
            try:
                s.loader.exec_module(module)
            finally:
                sys.path.pop(0)
        else:
            module = importlib.import_module(mod_name)
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's module; report it
        raise UsageError(f"{what} {spec!r}: import failed: {type(e).__name__}: {e}") from None
    if not hasattr(module, name):
        raise UsageError(f"{what} {spec!r}: {mod_name} has no {name!r}")
    return getattr(module, name)


def _default_batch(spec: str, model):
    """``make_batch`` next to the factory, else N(0, 1) rows for the first Linear layer."""
    import torch
    from torch import nn
    mod_name = spec.rpartition(":")[0]
    try:
        return load_callable(f"{mod_name}:make_batch", "--batch")()
    except UsageError:
        pass
    first = next((m for m in model.modules() if isinstance(m, nn.Linear)), None)
    if first is None:
        raise UsageError("no --batch given and the model has no Linear layer to shape a random one")
    p = first.weight
    return torch.randn(16, first.in_features, generator=torch.Generator().manual_seed(0)).to(p.device, p.dtype)


def run_audit_model(args) -> int:
    from .model_audit import DEFAULT_FORMATS, audit_model
    from .progress import progress_bar
    try:
        factory = load_callable(args.model, "MODEL")
        try:
            model = factory()
        except Exception as e:  # noqa: BLE001
            raise UsageError(f"{args.model}() failed: {type(e).__name__}: {e}") from None
        if args.batch:
            fn = load_callable(args.batch, "--batch")
            try:
                batch = fn()
            except Exception as e:  # noqa: BLE001
                raise UsageError(f"{args.batch}() failed: {type(e).__name__}: {e}") from None
        else:
            batch = _default_batch(args.model, model)
        formats = tuple(f.strip() for f in args.formats.split(",") if f.strip()) if args.formats else DEFAULT_FORMATS
        try:
            res = audit_model(model, batch, formats, threshold_db=args.threshold,
                              progress=progress_bar("audit model"))
        except (ValueError, TypeError) as e:
            raise UsageError(str(e)) from None
    except UsageError as e:
        return _err("model", str(e))
    print(json.dumps(res.to_dict(), indent=1) if args.json else res.format())
    return 0


# ---- hardware ----------------------------------------------------------------------------------------
def run_audit_hardware(args) -> int:
    from .hardware import NoGPU, audit_hardware
    try:
        res = audit_hardware()
    except NoGPU as e:
        return _err("hardware", str(e))
    print(res.to_json() if args.json else res.format())
    return 0
