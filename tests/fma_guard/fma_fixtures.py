"""Helpers of the fma_guard tests: fixture kernels loaded from files (a module of its own name: every
test folder has a ``conftest``, so ``from conftest import`` would find another folder's).

Fixture kernels live in ``fixtures/*.py``; lines where the scan must report carry ``# HAZARD``.
"""
import importlib.util
import inspect
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")


def load_fixture(name: str, *, tag: str = ""):
    """Import ``fixtures/<name>.py`` under a private module name (``tag`` gives a separate copy)."""
    mod_name = f"fma_fixture_{name}{tag}"
    spec = importlib.util.spec_from_file_location(mod_name, os.path.join(FIXTURES, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod


def hazard_lines(kernel) -> set:
    """Source lines of ``kernel`` marked ``# HAZARD``."""
    fn = kernel.fn if hasattr(kernel, "fn") else kernel
    src, start = inspect.getsourcelines(fn)
    return {start + i for i, line in enumerate(src) if "# HAZARD" in line}


def fixture_cases(mods):
    """(id, kernel, signature, constexprs) for every planted kernel and safe twin."""
    sm, rw, at, cp = mods["online_softmax"], mods["rowwise"], mods["attention"], mods["compare"]
    cases = [(k.fn.__name__, k, sm.SIGNATURE, sm.CONSTEXPRS) for k in sm.HAZARDOUS + sm.SAFE]
    cases += [(k.fn.__name__, k, rw.LSE_SIGNATURE, rw.CONSTEXPRS) for k in (rw.logsumexp_rows, rw.logsumexp_rows_safe)]
    cases += [(k.fn.__name__, k, rw.VAR_SIGNATURE, rw.CONSTEXPRS) for k in (rw.variance_rows, rw.variance_rows_safe)]
    cases += [(k.fn.__name__, k, at.SIGNATURE, at.CONSTEXPRS) for k in (at.attention_fwd, at.attention_fwd_safe)]
    cases += [(k.fn.__name__, k, cp.SIGNATURE, cp.CONSTEXPRS) for k in (cp.top_mask, cp.top_mask_safe)]
    return cases
