"""Backward walks over a parsed PTX function: value identity, sign parity, reductions, data sources.

Every walk follows the definitions that *reach* a use (``PtxFunction.producers(reg, at)``), so a
register redefined in another branch (NVPTX reuses registers after phi elimination) is not
mistaken for a source. The questions the hazard rules ask:

* ``canon(r, at)`` -- which value is this, up to copies? Follows ``mov`` chains to a single
  definition, a kernel parameter (``param:NAME``) or an immediate, counting ``neg`` (parity).
* ``frontier(r, at)`` -- walking back through *transparent* instructions (copies, negation,
  conversion, ``selp``, warp shuffles, shared-memory round trips) and optionally through max/min
  (``max``/``min``, or a compare-and-select between the same operands), which computing instructions
  are reached, with the sign parity and the max/min crossed.
* ``linear_frontier(r, at)`` -- the rounded data-by-data products reached through linear steps
  (sums, fma addends, scaling by uniform values).
* ``data_leaves(r, at)`` -- the global loads ``r`` derives from through any arithmetic, and whether a
  warp shuffle (a cross-lane reduction; layout conversions go through shared memory instead) was
  crossed.
"""
from __future__ import annotations

import dataclasses

from .ptx import FLOAT_TYPES, Instr, PtxFunction

__all__ = ["Dataflow", "Reached", "is_rounded_mul", "is_contraction"]

_COPY = frozenset({"mov", "cvt", "cvta"})
_SELECT = frozenset({"max", "min"})


def is_rounded_mul(ins: Instr) -> bool:
    """A floating-point multiply whose product is rounded to the destination type."""
    return ins.base == "mul" and ins.ftype in FLOAT_TYPES


def is_contraction(ins: Instr) -> bool:
    """A fused multiply-add: the product ``a*b`` enters the add unrounded."""
    return ins.base in ("fma", "mad") and ins.ftype in FLOAT_TYPES


def _is_negation(ins: Instr) -> bool:
    """``sub d, 0, x`` (a negation written as a subtraction from zero)."""
    return (ins.base == "sub" and ins.ftype is not None and len(ins.args) == 2
            and ins.args[0] in ("0f00000000", "0f80000000", "0d0000000000000000"))


def _is_reg(a) -> bool:
    return isinstance(a, str) and (a.startswith(("%", "$")) or "@" in a)


@dataclasses.dataclass(frozen=True)
class Reached:
    """A register reached by a backward walk, with its defining instruction (None: a leaf)."""
    reg: str
    at: Instr | None        # the instruction that used ``reg`` on the path
    ins: Instr | None
    parity: int             # number of negations on the path, mod 2
    select: Instr | None    # the max/min crossed on the way (the last one), if any

    @property
    def via_select(self) -> bool:
        return self.select is not None


class Dataflow:
    def __init__(self, fn: PtxFunction):
        self.fn = fn
        self._leaves: dict = {}  # filled lazily by _closures()

    def defs(self, reg, at: Instr | None) -> list[Instr]:
        return self.fn.producers(reg, at) if _is_reg(reg) else []

    # -- identity -------------------------------------------------------------------------------------
    def canon(self, op, at: Instr | None) -> tuple[str, int]:
        """(canonical name, negation parity) of an operand (register or immediate) used at ``at``."""
        parity = 0
        for _ in range(64):
            if not _is_reg(op):
                break
            defs = self.defs(op, at)
            if len(defs) != 1:
                break
            d = defs[0]
            if d.base == "mov" and len(d.args) == 1 and isinstance(d.args[0], str):
                op, at = d.args[0], d
            elif d.base == "neg" and d.ftype and len(d.args) == 1:
                parity ^= 1
                op, at = d.args[0], d
            elif d.base == "ld" and d.space == "param" and d.args:
                return "param:" + d.args[0].strip("[]"), parity
            else:
                return f"{op}#{d.idx}", parity
        return op, parity

    def array_key(self, reg, at: Instr | None) -> str | None:
        """``array:PARAM`` when ``reg`` is loaded from global memory at an address based on one
        pointer parameter (a predicated load's ``mov 0`` default ignored), else None."""
        defs = [d for d in self.defs(reg, at)
                if not (d.base == "mov" and all(isinstance(a, str) and not _is_reg(a) for a in d.args))]
        if len(defs) != 1 or defs[0].base != "ld" or defs[0].space not in (None, "global") or not defs[0].addr:
            return None
        params, stack, seen = set(), [(r, defs[0]) for r in defs[0].addr], set()
        while stack and len(seen) < 512:
            r, use = stack.pop()
            if (r, use.idx) in seen or not _is_reg(r):
                continue
            seen.add((r, use.idx))
            for d in self.defs(r, use):
                if d.base == "ld" and d.space == "param":
                    if "b64" in d.mods or "u64" in d.mods:  # pointers; i32 sizes/strides are not bases
                        params.add(d.args[0].strip("[]") if d.args else r)
                elif d.base != "ld":
                    stack.extend((s, d) for s in d.srcs)
        return f"array:{params.pop()}" if len(params) == 1 else None

    def same_value(self, p, at_p, q, at_q) -> bool:
        """``p`` and ``q`` hold the same value up to copies, or are loads from the same array
        (e.g. one loop re-reading what an earlier loop reduced)."""
        if self.canon(p, at_p)[0] == self.canon(q, at_q)[0]:
            return True
        kp = self.array_key(p, at_p)
        return kp is not None and kp == self.array_key(q, at_q)

    # -- transparent walk --------------------------------------------------------------------------
    def value_args(self, ins: Instr) -> list[tuple[str, Instr]] | None:
        """(operand, its use) pairs whose value ``ins`` passes on unchanged (up to sign/format), or None."""
        b = ins.base
        if b in _COPY or (b in ("neg", "abs") and ins.ftype):
            regs = [a for a in ins.args if isinstance(a, str)] + [r for a in ins.args if isinstance(a, tuple)
                                                                 for r in a]
            return [(r, ins) for r in regs]
        if b in ("selp", "prmt"):
            return [(a, ins) for a in ins.args[:2] if isinstance(a, str)]
        if b == "shfl":
            return [(ins.args[0], ins)] if ins.args and isinstance(ins.args[0], str) else []
        if b == "ld" and ins.space == "shared":
            return [(r, st) for st in self.fn._smem_links.get(ins.idx, ()) for r in st.srcs]
        return None

    def is_compare_select(self, ins: Instr) -> bool:
        """``selp d, a, b, p`` with ``p = setp(a or b, ...)``: a max/min written as compare + select
        (inductor's NaN-propagating ``maximum``), as opposed to a mask select."""
        if ins.base != "selp" or len(ins.args) < 3 or not _is_reg(ins.args[2]):
            return False
        ops = {a for a in ins.args[:2] if _is_reg(a)}
        for d in self.defs(ins.args[2], ins):
            if d.base == "setp" and d.ftype and ops & {a for a in d.args[:2] if isinstance(a, str)}:
                return True
        return False

    def frontier(self, reg, at: Instr | None, *, through_select: bool) -> list[Reached]:
        """Computing instructions (or leaves) reached backwards from ``reg`` through transparent ops."""
        out: list[Reached] = []
        if not _is_reg(reg):
            return out
        stack: list = [(reg, at, 0, None)]
        seen = set()
        while stack:
            r, use, par, sel = stack.pop()
            key = (r, use.idx if use is not None else -1, par, sel is None)
            if key in seen:
                continue
            seen.add(key)
            defs = self.defs(r, use)
            if not defs:
                out.append(Reached(r, use, None, par, sel))
                continue
            for d in defs:
                if through_select and ((d.base in _SELECT and d.ftype) or self.is_compare_select(d)):
                    stack.extend((a, d, par, d) for a in d.args[:2] if _is_reg(a))
                    continue
                vals = self.value_args(d)
                if vals is None and _is_negation(d):
                    vals = [(d.args[1], d)]
                if vals is None:
                    out.append(Reached(r, use, d, par, sel))
                    continue
                flip = 1 if d.base in ("neg", "sub") else 0
                stack.extend((a, u, par ^ flip, sel) for a, u in vals if _is_reg(a))
        return out

    def linear_frontier(self, reg, at: Instr | None) -> list[tuple[Instr, int, bool]]:
        """Rounded data-by-data products reached backwards from ``reg`` through linear steps.

        Linear steps: the transparent ones, max/min, ``add``/``sub`` (sign tracked), the addend of an
        ``fma`` (an accumulation), and ``mul``/``div`` by a uniform value (no global load behind it,
        e.g. ``1/N`` or a scale parameter). Returns ``(mul, parity, crossed a warp shuffle)``."""
        out: list[tuple[Instr, int, bool]] = []
        if not _is_reg(reg):
            return out
        stack: list = [(reg, at, 0, False)]
        seen = set()
        while stack and len(seen) < 20000:
            r, use, par, crossed = stack.pop()
            key = (r, use.idx if use is not None else -1, par, crossed)
            if key in seen:
                continue
            seen.add(key)
            for d in self.defs(r, use):
                x = crossed or d.base == "shfl"
                vals = self.value_args(d)
                if vals is not None:
                    nxt = [(a, u, par ^ (1 if d.base == "neg" else 0)) for a, u in vals]
                elif not d.ftype:
                    continue
                elif d.base in _SELECT or d.base == "add":
                    nxt = [(a, d, par) for a in d.args[:2]]
                elif d.base == "sub" and len(d.args) >= 2:
                    nxt = [(d.args[0], d, par), (d.args[1], d, par ^ 1)]
                elif d.base in ("fma", "mad") and len(d.args) >= 3:
                    nxt = [(d.args[2], d, par)]
                elif d.base in ("mul", "div") and len(d.args) >= 2:
                    uniform = [not self.data_leaves(a, d)[0] for a in d.args[:2]]
                    if d.base == "mul" and not any(uniform):
                        out.append((d, par, x))
                        continue
                    nxt = [(a, d, par) for a, u in zip(d.args[:2], uniform) if not u][:1]
                else:
                    continue
                stack.extend((a, u, p, x) for a, u, p in nxt if _is_reg(a))
        return out

    def reduces_to(self, reg, at, target, target_at) -> bool:
        """True when ``reg`` is a max/min reduction (through transparent ops) over ``target``'s value."""
        for r in self.frontier(reg, at, through_select=True):
            if r.via_select and self.same_value(r.reg, r.at, target, target_at):
                return True
        return False

    # -- data sources -------------------------------------------------------------------------------
    def data_leaves(self, reg, at: Instr | None) -> tuple[int, bool]:
        """(bitmask of the global loads ``reg`` derives from, whether a warp shuffle -- the mark of a
        cross-lane reduction -- was crossed)."""
        lv, cr, _ = self._closure_of(reg, at)
        return lv, cr

    def ancestry(self, reg, at: Instr | None) -> int:
        """Bitmask of the instructions ``reg`` (used at ``at``) derives from."""
        return self._closure_of(reg, at)[2]

    def _closure_of(self, reg, at):
        if not _is_reg(reg):
            return 0, False, 0
        lv, cr, anc = self._closures()
        out_l, out_c, out_a = 0, False, 0
        for d in self.defs(reg, at):
            out_l |= lv[d.idx]
            out_c |= cr[d.idx]
            out_a |= anc[d.idx]
        return out_l, out_c, out_a

    def _closures(self):
        """Per instruction: loads, lane-crossing and ancestors of its result, by fixed-point iteration
        in program order (loops converge in a few passes); bitmasks over instruction indices."""
        if self._leaves:
            return self._leaves["lv"], self._leaves["cr"], self._leaves["anc"]
        n = len(self.fn.instrs)
        lv, cr, anc = [0] * n, [False] * n, [0] * n
        preds: list[list[int]] = []
        for ins in self.fn.instrs:
            if ins.base == "ld" and ins.space != "shared":
                preds.append([])
                continue
            pairs = (self.value_args(ins) or []) if ins.base == "ld" else [(s_, ins) for s_ in ins.srcs
                                                                        if s_ not in ins.addr]
            preds.append(sorted({d.idx for r, u in pairs if _is_reg(r) for d in self.defs(r, u)}))
        for ins in self.fn.instrs:
            i = ins.idx
            anc[i] = 1 << i
            if ins.base == "ld" and ins.space not in ("shared", "param"):
                lv[i] = 1 << i
            cr[i] = ins.base == "shfl"
        changed = True
        while changed:
            changed = False
            for i, ps in enumerate(preds):
                a, l_, c = anc[i], lv[i], cr[i]
                for p_ in ps:
                    a |= anc[p_]
                    l_ |= lv[p_]
                    c = c or cr[p_]
                if a != anc[i] or l_ != lv[i] or c != cr[i]:
                    anc[i], lv[i], cr[i] = a, l_, c
                    changed = True
        self._leaves = {"lv": lv, "cr": cr, "anc": anc}
        return lv, cr, anc
