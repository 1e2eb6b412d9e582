"""Compile a Triton kernel for a GPU target without a GPU, and keep its PTX and LLVM IR.

``compile_kernel(kernel, signature, constexprs, target="sm_90", enable_fp_fusion=True)`` runs
``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``: the whole NVIDIA pipeline
(TTIR -> TTGIR -> LLVM IR -> PTX -> cubin) runs on the CPU, so CI can judge the exact PTX a launch
on an H100/H200 would get. Works with triton 3.6 and 3.9 (both take ``ASTSource(fn, signature,
constexprs, attrs)`` with every argument, constexprs included, named in ``signature``).

What the launch would specialise and we mimic: pointer arguments are 16-byte aligned
(``tt.divisibility = 16``, which is what the JIT records for tensors from the caching allocator),
``num_warps=4``, ``num_stages=3``. Fusion is always passed explicitly (triton 3.9 warns when it
is left to its default, and 3.10 flips that default). ptxas is skipped (see ``_ptx_only``): the
scan judges the PTX.

Accepted kernels: a ``JITFunction``; an ``Autotuner``/``Heuristics``/inductor ``CachingAutotuner``
wrapping one (unwrapped through ``.fn``); an ``InterpretedFunction`` (a kernel decorated while
``TRITON_INTERPRET=1``), rebuilt as a ``JITFunction`` whose globals have every interpreted helper
rebuilt the same way.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import types
from typing import Any, Mapping
from unittest import mock

from .pristine import pristine_language

__all__ = ["CompiledAsm", "compile_kernel", "as_jit_function", "parse_target", "signature_from_args",
           "normalize_signature"]

_TORCH_DTYPE_TO_TRITON = {
    "float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
    "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", "float8_e8m0fnu": "u8",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8",
    "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "i1",
}


@dataclasses.dataclass(frozen=True)
class CompiledAsm:
    """The assembly of one compiled kernel: ``ptx`` and ``llir`` text, plus how it was made."""
    name: str
    ptx: str
    llir: str
    target: str
    enable_fp_fusion: bool
    signature: tuple
    constexprs: tuple
    source_file: str


def parse_target(target) -> Any:
    """``"sm_90"`` / ``"sm_90a"`` / ``90`` / a ``GPUTarget`` -> ``GPUTarget("cuda", 90, 32)``."""
    from triton.backends.compiler import GPUTarget
    if isinstance(target, GPUTarget):
        return target
    if isinstance(target, int):
        return GPUTarget("cuda", target, 32)
    if isinstance(target, str):
        t = target.lower().strip()
        if t.startswith("sm_"):
            digits = t[3:].rstrip("a")
            if digits.isdigit():
                return GPUTarget("cuda", int(digits), 32)
    raise ValueError(f"target {target!r}: expected 'sm_XY' (e.g. 'sm_90'), an int capability or a GPUTarget")


def as_jit_function(kernel):
    """The ``JITFunction`` behind ``kernel`` (see the module docstring for what is accepted)."""
    from triton.runtime.jit import JITFunction
    seen = 0
    obj = kernel
    while not isinstance(obj, JITFunction):
        if type(obj).__name__ == "InterpretedFunction":
            return _rebuild_interpreted(obj)
        if not hasattr(obj, "fn") or seen > 8:
            raise TypeError(f"{kernel!r} is not a Triton kernel (@triton.jit function, possibly autotuned)")
        obj = obj.fn
        seen += 1
    return obj


_REBUILT: dict = {}


def _rebuild_interpreted(ifn):
    """A JITFunction for an InterpretedFunction, with interpreted helpers in its globals rebuilt."""
    from triton.runtime.jit import JITFunction
    key = id(ifn.fn)
    if key in _REBUILT:
        return _REBUILT[key]
    fn = ifn.fn
    new_globals = dict(fn.__globals__)
    placeholder = types.FunctionType(fn.__code__, new_globals, fn.__name__, fn.__defaults__, fn.__closure__)
    placeholder.__module__ = fn.__module__
    placeholder.__qualname__ = fn.__qualname__
    placeholder.__annotations__ = dict(getattr(fn, "__annotations__", {}))
    placeholder.__kwdefaults__ = fn.__kwdefaults__
    kwargs = {k: v for k, v in getattr(ifn, "kwargs", {}).items()
              if k in ("version", "do_not_specialize", "do_not_specialize_on_alignment", "debug", "noinline")}
    jit = JITFunction(placeholder, **kwargs)
    _REBUILT[key] = jit  # before recursing: helpers may refer back
    for name in fn.__code__.co_names:
        val = new_globals.get(name)
        if type(val).__name__ == "InterpretedFunction":
            new_globals[name] = _rebuild_interpreted(val)
    return jit


def _tensor_type(t) -> str:
    name = str(t.dtype).replace("torch.", "")
    if name not in _TORCH_DTYPE_TO_TRITON:
        raise TypeError(f"tensor dtype {t.dtype} has no Triton pointer type")
    return "*" + _TORCH_DTYPE_TO_TRITON[name]


def _value_type(v) -> str:
    if isinstance(v, str):  # already a Triton type string
        return v.strip()
    if hasattr(v, "data_ptr") and hasattr(v, "dtype"):
        return _tensor_type(v)
    if isinstance(v, bool):
        return "i1"
    if isinstance(v, int):
        return "i32" if -2**31 <= v < 2**31 else "i64"
    if isinstance(v, float):
        return "fp32"
    raise TypeError(f"cannot infer a Triton type for {type(v).__name__} {v!r}; pass a signature string")


def signature_from_args(jit, args, constexprs=None) -> tuple[dict, dict]:
    """(signature, constexprs) from example launch arguments (positional list or name -> value).

    Strings are taken as Triton types as they are; tensors give pointer types by dtype, ints ``i32`` (``i64`` when they do not fit), floats ``fp32``;
    values for parameters annotated ``tl.constexpr`` become constexprs."""
    constexprs = dict(constexprs or {})
    if isinstance(args, Mapping):
        named = dict(args)
        unknown = [k for k in named if k not in jit.arg_names]
        if unknown:
            raise ValueError(f"{jit.__name__}: unknown parameter(s) {unknown}; parameters are {jit.arg_names}")
    else:
        args = list(args)
        if len(args) > len(jit.arg_names):
            raise ValueError(f"{jit.__name__}: {len(args)} example args for {len(jit.arg_names)} parameters")
        named = dict(zip(jit.arg_names, args))
    sig = {}
    for p in jit.params:
        if p.name not in named:
            continue
        if p.is_constexpr:
            if named[p.name] != "constexpr":
                constexprs.setdefault(p.name, named[p.name])
        else:
            sig[p.name] = _value_type(named[p.name])
    return sig, constexprs


def normalize_signature(jit, signature: Mapping, constexprs: Mapping | None) -> tuple[dict, dict]:
    """Full ``{arg: type}`` signature in parameter order, constexprs marked ``"constexpr"``.

    Unknown names and missing types are errors; a constexpr parameter left out takes its default."""
    constexprs = dict(constexprs or {})
    unknown = [k for k in list(signature) + list(constexprs) if k not in jit.arg_names]
    if unknown:
        raise ValueError(f"{jit.__name__}: unknown parameter(s) {unknown}; parameters are {jit.arg_names}")
    full = {}
    missing = []
    for p in jit.params:
        if p.name in constexprs:
            full[p.name] = "constexpr"
        elif p.is_constexpr:
            default = p._param.default
            if default is p._param.empty:
                missing.append(f"{p.name} (constexpr value)")
            else:
                constexprs[p.name] = default
                full[p.name] = "constexpr"
        elif p.name in signature:
            ty = str(signature[p.name]).strip()
            if ty == "constexpr":
                missing.append(f"{p.name} (constexpr value)")
            full[p.name] = ty
        else:
            missing.append(p.name)
    if missing:
        raise ValueError(f"{jit.__name__}: no type/value for {', '.join(missing)}")
    return full, constexprs


def compile_kernel(kernel, signature, constexprs=None, *, target="sm_90", enable_fp_fusion=True,
                   num_warps=4, num_stages=3, attrs=None) -> CompiledAsm:
    """Compile ``kernel`` for ``target`` and return its PTX and LLVM IR (cached per configuration).

    ``signature`` maps argument names to Triton types (``"*fp32"``, ``"i32"``, ``"fp32"``...), or is
    a list/dict of example launch arguments (see ``signature_from_args``)."""
    jit = as_jit_function(kernel)
    sig, cx = signature_from_args(jit, signature, constexprs)
    full, cx = normalize_signature(jit, sig, cx)
    gpu = parse_target(target)
    if attrs is None:
        attrs = {(i,): [["tt.divisibility", 16]] for i, ty in enumerate(full.values()) if ty.startswith("*")}
    key = (id(jit), tuple(full.items()), tuple(sorted((k, _freeze(v)) for k, v in cx.items())),
           tuple(sorted((k, str(v)) for k, v in attrs.items())), gpu.arch, bool(enable_fp_fusion),
           int(num_warps), int(num_stages))
    hit = _CACHE.get(key)  # keyed by id (hashing a JITFunction computes its cache key, see pristine.py)
    if hit is None or hit[0] is not jit:
        hit = (jit, _compile(jit, full, cx, attrs, gpu.arch, bool(enable_fp_fusion), int(num_warps),
                             int(num_stages)))
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = hit
    return hit[1]


# Per-process memo of compiled configurations (compiling costs ~0.2-1.5 s; tests and the CLI scan the
# same kernel with fusion on and off, and the guard re-scans). Bounded, oldest dropped first.
_CACHE: dict = {}
_CACHE_SIZE = 256


@functools.lru_cache(maxsize=None)
def _path_keyed_source_class():
    from triton.compiler import ASTSource

    class PathKeyedSource(ASTSource):
        """Triton's cache key hashes the source text, not its file; the PTX's ``.file`` paths (what
        findings point at) must be this kernel's, not those of an identical copy compiled earlier."""

        def hash(self):
            import hashlib
            return hashlib.sha256((super().hash() + self.fn.fn.__code__.co_filename).encode()).hexdigest()

    return PathKeyedSource


def _PathKeyedSource(*args, **kwargs):
    return _path_keyed_source_class()(*args, **kwargs)


@contextlib.contextmanager
def _ptx_only():
    """Skip ptxas (the cubin stage; up to half the compile time, and the scan needs only PTX): the
    NVIDIA backend's ``make_cubin`` returns an empty image while we compile, into a cache folder of
    our own (``<triton cache>/lowbit-fma-guard-ptx``) so no launch can ever pick up that image."""
    try:
        from triton import knobs
        from triton.backends.nvidia.compiler import CUDABackend
    except ImportError:  # a triton without these: compile in full
        yield
        return
    with knobs.cache.scope():
        knobs.cache.dir = os.path.join(knobs.cache.dir, "lowbit-fma-guard-ptx")
        with mock.patch.object(CUDABackend, "make_cubin", lambda self, *args, **kwargs: b""):
            yield


def _freeze(v):
    try:
        hash(v)
        return v
    except TypeError:
        return repr(v)


def _compile(jit, full, cx, attrs, arch, fusion, num_warps, num_stages) -> CompiledAsm:
    import triton
    from triton.backends.compiler import GPUTarget
    src = _PathKeyedSource(jit, full, constexprs=cx, attrs=attrs)
    options = {"enable_fp_fusion": fusion, "num_warps": num_warps, "num_stages": num_stages}
    modules = [v for v in jit.fn.__globals__.values() if isinstance(v, types.ModuleType)]
    with pristine_language(modules), _ptx_only():
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    asm = compiled.asm
    return CompiledAsm(name=jit.__name__, ptx=asm["ptx"], llir=asm.get("llir", ""), target=f"sm_{arch}",
                       enable_fp_fusion=fusion, signature=tuple(full.items()),
                       constexprs=tuple(sorted((k, repr(v)) for k, v in cx.items())),
                       source_file=jit.fn.__code__.co_filename)
