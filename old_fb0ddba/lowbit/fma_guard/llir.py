"""LLVM IR view: which ``fmul`` results feed an ``fadd``/``fsub`` (what NVPTX may contract).

Triton's LLVM IR is the same with fusion on or off; contraction happens when NVPTX selects
instructions (``AllowFPOpFusion``). So the IR lists what the source computes and where fusion
*could* apply: an ``fmul`` whose value reaches an ``fadd``/``fsub`` (through vector
insert/extract/shuffle, bitcast, select, phi). ``other_uses`` names its other consumers (e.g.
``llvm.maxnum.f32``): a product used twice is the "compute once and reuse" case that NVPTX still
fuses into the subtraction. The PTX scan decides; this is the explanation beside it.
"""
from __future__ import annotations

import dataclasses
import os
import re

__all__ = ["IRContraction", "ir_contractions"]

_INS_RE = re.compile(r"^\s*(%[\w.]+)\s*=\s*(.*)$")
_DBG_RE = re.compile(r"!dbg\s+!(\d+)")
_MD_RE = re.compile(r"^!(\d+)\s*=\s*(?:distinct\s+)?!(\w+)\((.*)\)\s*$")
_FIELD_RE = re.compile(r"(\w+):\s*(\"[^\"]*\"|![\d]+|[\w.-]+)")
_PASS = ("extractelement", "insertelement", "shufflevector", "bitcast", "select", "phi", "fneg")
_LIB = ("/triton/language/", "/triton/runtime/", "/torch/_inductor/runtime/")


@dataclasses.dataclass(frozen=True)
class IRContraction:
    """An ``fmul`` (at ``source``) whose product reaches an ``fadd``/``fsub`` at ``add_source``."""
    source: str
    add_source: str
    other_uses: tuple[str, ...]


def _op_of(rhs: str) -> str:
    rhs = re.sub(r"^(tail\s+|notail\s+|musttail\s+)?call\s+", "call ", rhs)
    if rhs.startswith("call "):
        m = re.search(r"@([\w.$]+)\s*\(", rhs)
        return m.group(1) if m else "call"
    tok = rhs.split(None, 1)[0]
    return tok


def _metadata(text: str) -> dict[int, tuple[str, dict]]:
    md = {}
    for line in text.splitlines():
        m = _MD_RE.match(line.strip())
        if m:
            md[int(m.group(1))] = (m.group(2), dict(_FIELD_RE.findall(m.group(3))))
    return md


def _location(md, ref: int | None) -> str:
    """Innermost non-library ``path:line`` of a DILocation, following inlinedAt."""
    first = None
    for _ in range(16):
        if ref is None or ref not in md:
            break
        kind, f = md[ref]
        if kind != "DILocation":
            break
        path = _file_of(md, f.get("scope"))
        here = f"{path}:{f.get('line', '?')}"
        first = first or here
        if not any(s in path.replace("\\", "/") for s in _LIB):
            return here
        nxt = f.get("inlinedAt")
        ref = int(nxt[1:]) if nxt else None
    return first or "?"


def _file_of(md, scope) -> str:
    for _ in range(16):
        if not scope or not scope.startswith("!"):
            return "?"
        kind, f = md.get(int(scope[1:]), ("", {}))
        if kind == "DIFile":
            return os.path.join(f.get("directory", '""').strip('"'), f.get("filename", '""').strip('"'))
        scope = f.get("file") or f.get("scope")
    return "?"


def ir_contractions(llir: str) -> list[IRContraction]:
    """Every fmul whose value reaches an fadd/fsub, with its source lines and other consumers (deduplicated)."""
    md = _metadata(llir)
    defs: dict[str, tuple[str, int | None]] = {}
    users: dict[str, list[tuple[str, str, int | None]]] = {}
    for line in llir.splitlines():
        m = _INS_RE.match(line)
        if not m:
            continue
        name, rhs = m.group(1), m.group(2)
        op = _op_of(rhs)
        dbg = _DBG_RE.search(rhs)
        ref = int(dbg.group(1)) if dbg else None
        defs[name] = (op, ref)
        for used in set(re.findall(r"(%[\w.]+)", rhs.split("!dbg")[0])):
            if used != name:
                users.setdefault(used, []).append((name, op, ref))
    out: list[IRContraction] = []
    for name, (op, ref) in defs.items():
        if op != "fmul":
            continue
        adds, others, stack, seen = [], set(), [name], set()
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            for u, uop, uref in users.get(v, []):
                if uop in ("fadd", "fsub"):
                    adds.append(uref)
                elif uop in _PASS:
                    stack.append(u)
                else:
                    others.add(uop)
        if adds:
            c = IRContraction(_location(md, ref), _location(md, adds[0]), tuple(sorted(others)))
            if c not in out:  # one entry per source pattern, not per vector lane
                out.append(c)
    return out
