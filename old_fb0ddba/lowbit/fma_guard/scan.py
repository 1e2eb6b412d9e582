"""The FMA-contraction hazard scan: rules over the PTX dataflow, and the Report/Finding it returns.

A contraction ``fma(a, b, c) = round(a*b + c)`` uses the exact product. It is a hazard when the same
product (or a quantity it should cancel exactly) also exists *rounded* and the two meet in a
subtraction or comparison, because then ``a*b - round(a*b) != 0`` leaks into the result:

``max-of-rounded-products``
    the addend derives (through copies, negation, conversions, ``selp``, shuffles, shared memory)
    from a max/min reduction over ``round(a*b)``, or from ``round(max(a) * b)`` (which is the same
    number): the online-softmax pattern ``exp2(x*s - max(x*s))``. At the arg-max the exponent
    argument is ``x*s - round(x*s)``, up to +ulp(m)/2 instead of 0.
``contracted-vs-rounded-cancellation``
    the addend derives (through sums, fma addends, scaling by uniform values) from a rounded
    data-by-data product that shares global loads with ``a``/``b``, does not feed ``a``/``b`` itself,
    and a warp-shuffle reduction lies on the way or behind both products: two estimates of one
    quantity, one contracted, one rounded, subtracted (``E[x^2] - mean^2``): a constant row gives
    ``+-(c^2 - round(c^2))``, possibly < 0. (A reduction held entirely inside one thread has no
    shuffle and is not recognised.)
``contracted-vs-rounded-compare``
    a comparison or subtraction whose one side holds ``fma(a, b, .)`` and other side ``round(a*b)``
    (possibly through a max/min): one value computed twice, once contracted and once not.

Not flagged: ``fma(a, b, -round(a*b))`` reached without any reduction (the error-free product
transform, deliberate) and accumulations (addend of the same sign as the product).
``add``/``sub`` fed by a ``mul`` where neither carries a rounding modifier are treated as
contractions too: ptxas may fuse them (``--fmad=true``) even where LLVM did not.
"""
from __future__ import annotations

import dataclasses
import linecache

from .dataflow import Dataflow, is_contraction, is_rounded_mul
from .llir import IRContraction, ir_contractions
from .ptx import Instr, PtxFunction, parse_ptx

__all__ = ["Finding", "Report", "scan_ptx", "KINDS", "FIXES"]

MAX = "max-of-rounded-products"
CANCEL = "contracted-vs-rounded-cancellation"
COMPARE = "contracted-vs-rounded-compare"
KINDS = (MAX, CANCEL, COMPARE)

FIXES = {
    MAX: ("subtract the max of the raw scores, then scale: exp2((x - max(x)) * s) (a subtract-then-multiply "
          "has no fma form); or fold the scale into an operand before the dot (q * s); or compile with "
          "enable_fp_fusion=False (lowbit.fma_guard.guard); or round the product explicitly "
          "(libdevice.mul_rn(x, s)) so both uses see the same number"),
    CANCEL: ("do not subtract a contracted product from a rounded one: centre first "
             "(mean, then sum((x - mean)^2)); or compile with enable_fp_fusion=False "
             "(lowbit.fma_guard.guard); or round both products explicitly (libdevice.mul_rn)"),
    COMPARE: ("compute the value once with explicit rounding (libdevice.mul_rn) and use that for both sides; "
              "or compile with enable_fp_fusion=False (lowbit.fma_guard.guard)"),
}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One hazard: where (PTX lines, Python ``file:line``), what kind, related lines, and the fix."""
    kernel: str
    kind: str
    source: str                       # "path:line" of the contracted subtraction / comparison
    source_text: str
    ptx_lines: tuple[int, ...]
    ptx_text: tuple[str, ...]
    related: tuple[tuple[str, str], ...]   # (role, "path:line")
    fix: str
    detail: str
    orientation: int                  # +1: result = exact product - rounded copy; -1: the reverse
    multiplicands: tuple[str, str]    # canonical operands of the contracted product
    by_ptxas: bool = False            # the contraction is ptxas's to make (mul/add without .rn)

    @property
    def line(self) -> int:
        return int(self.source.rsplit(":", 1)[1])

    @property
    def path(self) -> str:
        return self.source.rsplit(":", 1)[0]

    def format(self) -> str:
        rel = "; ".join(f"{role} at {where}" for role, where in self.related)
        ptx = ", ".join(str(n) for n in self.ptx_lines[:8]) + (" ..." if len(self.ptx_lines) > 8 else "")
        return (f"[{self.kind}] {self.kernel} at {self.source}: {self.source_text}\n"
                f"    {self.detail}\n"
                + (f"    related: {rel}\n" if rel else "")
                + f"    PTX lines {ptx}: {self.ptx_text[0]}\n"
                f"    fix: {self.fix}")


@dataclasses.dataclass(frozen=True)
class Report:
    """Result of scanning one compiled kernel. ``clean`` is True when no hazard was found."""
    kernel: str
    target: str
    enable_fp_fusion: bool | None
    findings: tuple[Finding, ...]
    n_fma: int
    n_mul: int
    ir_contractions: tuple[IRContraction, ...] = ()
    ptx: str = dataclasses.field(default="", repr=False)
    llir: str = dataclasses.field(default="", repr=False)

    @property
    def clean(self) -> bool:
        return not self.findings

    def format(self) -> str:
        fusion = {True: "fusion on", False: "fusion off", None: "fusion ?"}[self.enable_fp_fusion]
        head = (f"{self.kernel} ({self.target}, {fusion}): {len(self.findings)} hazard(s); "
                f"PTX has {self.n_fma} fma, {self.n_mul} mul")
        if self.ir_contractions:
            multi = sum(1 for c in self.ir_contractions if c.other_uses)
            head += (f"; LLVM IR has {len(self.ir_contractions)} contractible fmul->fadd/fsub"
                     f" ({multi} whose product is also used elsewhere)")
        return "\n".join([head] + [f.format() for f in self.findings])

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "target": self.target, "enable_fp_fusion": self.enable_fp_fusion,
                "clean": self.clean, "n_fma": self.n_fma, "n_mul": self.n_mul,
                "ir_contractions": [dataclasses.asdict(c) for c in self.ir_contractions],
                "findings": [dataclasses.asdict(f) for f in self.findings]}


@dataclasses.dataclass(frozen=True)
class _Site:
    """A contraction ``(-1)^pp * a*b + (-1)^pc * c`` at ``ins``; ``ab_at`` is where a, b are used."""
    ins: Instr
    ab_at: Instr
    a: str
    b: str
    c: str
    prod_parity: int
    c_parity: int
    by_ptxas: bool


def _sites(fn: PtxFunction) -> list[_Site]:
    out = []
    for ins in fn.instrs:
        if is_contraction(ins) and len(ins.args) >= 3 and all(isinstance(x, str) for x in ins.args[:3]):
            out.append(_Site(ins, ins, ins.args[0], ins.args[1], ins.args[2], 0, 0, False))
        elif ins.base in ("add", "sub") and ins.ftype and ins.rounding is None and len(ins.args) == 2:
            for pos in (0, 1):
                defs = fn.producers(ins.args[pos], ins) if isinstance(ins.args[pos], str) else []
                if len(defs) == 1 and is_rounded_mul(defs[0]) and defs[0].rounding is None \
                        and all(isinstance(x, str) for x in defs[0].args[:2]):
                    m = defs[0]
                    prod_par = 1 if (ins.base == "sub" and pos == 1) else 0
                    c_par = 1 if (ins.base == "sub" and pos == 0) else 0
                    out.append(_Site(ins, m, m.args[0], m.args[1], ins.args[1 - pos], prod_par, c_par, True))
    return out


def _where(fn: PtxFunction, ins: Instr | None) -> tuple[str, int] | None:
    return fn.user_location(ins.loc) if ins is not None else None


def _fmt(loc) -> str:
    return f"{loc[0]}:{loc[1]}" if loc else "?"


def scan_ptx(ptx: str, *, kernel: str | None = None, llir: str = "", target: str = "sm_90",
             enable_fp_fusion: bool | None = None) -> Report:
    """Scan PTX text (and optionally its LLVM IR) for FMA-contraction hazards."""
    fn = parse_ptx(ptx)
    df = Dataflow(fn)
    hits: list[tuple] = []
    for site in _sites(fn):
        hits.extend(_site_hits(df, site))
    for ins in fn.instrs:
        if ins.ftype and ins.base in ("setp", "sub", "add", "max", "min") and len(ins.args) >= 2 \
                and all(isinstance(x, str) and x.startswith("%") for x in ins.args[:2]):
            hit = _compare(df, ins)
            if hit is not None:
                f, m, canon = hit
                hits.append((COMPARE, ins, m, f, "one side holds the contracted product, the other the rounded "
                             "product of the same operands", 1, canon, False))
    name = fn.name if kernel is None else kernel
    return Report(kernel=name, target=target, enable_fp_fusion=enable_fp_fusion, findings=_group(fn, name, hits),
                  n_fma=sum(1 for i in fn.instrs if is_contraction(i)),
                  n_mul=sum(1 for i in fn.instrs if is_rounded_mul(i)),
                  ir_contractions=tuple(ir_contractions(llir)) if llir else (), ptx=ptx, llir=llir)


def _site_hits(df: Dataflow, site: _Site) -> list[tuple]:
    (ca, pa), (cb, pb) = df.canon(site.a, site.ab_at), df.canon(site.b, site.ab_at)
    prod_par = site.prod_parity ^ pa ^ pb
    orient = -1 if prod_par else 1
    canon = (_pretty(ca), _pretty(cb))
    ab = ((site.a, site.ab_at), (site.b, site.ab_at))
    hits = []
    for r in df.frontier(site.c, site.ins, through_select=True):
        m = r.ins
        if m is None or not is_rounded_mul(m) or m is site.ins or len(m.args) < 2:
            continue
        if (r.parity ^ site.c_parity ^ _sign(df, m)) == prod_par:
            continue  # same sign as the product: an accumulation, not a difference
        if _same_pair(df, ab, m):
            if r.via_select:
                hits.append((MAX, site.ins, m, r.select, "the row max/min of the rounded products is subtracted "
                             "from the contracted (exact) product", orient, canon, site.by_ptxas))
            # straight fma(a, b, -round(a*b)) without a reduction: the error-free product transform
        elif _rescaled(df, ab, m):
            hits.append((MAX, site.ins, m, r.select, "the rounded product of the max/min (= max/min of the "
                         "rounded products) is subtracted from the contracted (exact) product", orient, canon,
                         site.by_ptxas))
    if hits:
        return hits
    for m, par, crossed in df.linear_frontier(site.c, site.ins):
        if m is site.ins or (par ^ site.c_parity ^ _sign(df, m)) == prod_par or _same_pair(df, ab, m):
            continue  # an accumulation; or the same product (the max rule's, or the error-free transform)
        if any(df.ancestry(r, at) >> m.idx & 1 for r, at in ab):
            continue  # the product feeds a multiplicand too (Horner / Newton steps): not an independent estimate
        la, xa = _leaves(df, ab)
        lm, xm = _leaves(df, [(m.args[0], m), (m.args[1], m)])
        if la & lm and (crossed or (xa and xm)):
            return [(CANCEL, site.ins, m, None, "a rounded product and a contracted product estimating the same "
                     "quantity (common loads, reduced across lanes) are subtracted", orient, canon, site.by_ptxas)]
    return []


def _pretty(c: str) -> str:
    return c.split("#", 1)[0]


def _sign(df: Dataflow, m: Instr) -> int:
    """Negation parity of a product's operands (``mul(neg(a), b)`` is ``-(a*b)``)."""
    return df.canon(m.args[0], m)[1] ^ df.canon(m.args[1], m)[1]


def _same_pair(df: Dataflow, ab, m: Instr) -> bool:
    (a, at_a), (b, at_b) = ab
    u, w = m.args[0], m.args[1]
    return ((df.same_value(a, at_a, u, m) and df.same_value(b, at_b, w, m))
            or (df.same_value(a, at_a, w, m) and df.same_value(b, at_b, u, m)))


def _rescaled(df: Dataflow, ab, m: Instr) -> bool:
    """``m = round(u*w)`` with one operand equal to a multiplicand and the other a max/min over the other."""
    (a, at_a), (b, at_b) = ab
    u, w = m.args[0], m.args[1]
    return ((df.same_value(u, m, a, at_a) and df.reduces_to(w, m, b, at_b))
            or (df.same_value(u, m, b, at_b) and df.reduces_to(w, m, a, at_a))
            or (df.same_value(w, m, a, at_a) and df.reduces_to(u, m, b, at_b))
            or (df.same_value(w, m, b, at_b) and df.reduces_to(u, m, a, at_a)))


def _leaves(df: Dataflow, regs):
    out, crossed = 0, False
    for r, at in regs:
        lv, x = df.data_leaves(r, at)
        out |= lv
        crossed |= x
    return out, crossed


def _compare(df: Dataflow, ins: Instr):
    p, q = ins.args[0], ins.args[1]
    for x, y in ((p, q), (q, p)):
        fs = [r.ins for r in df.frontier(x, ins, through_select=False) if r.ins is not None and is_contraction(r.ins)]
        if not fs:
            continue
        ms = [r.ins for r in df.frontier(y, ins, through_select=True) if r.ins is not None and is_rounded_mul(r.ins)]
        for f in fs:
            for m in ms:
                if _same_pair(df, ((f.args[0], f), (f.args[1], f)), m):
                    return f, m, (_pretty(df.canon(f.args[0], f)[0]), _pretty(df.canon(f.args[1], f)[0]))
    return None


def _group(fn: PtxFunction, kernel: str, hits) -> tuple[Finding, ...]:
    groups: dict = {}
    for kind, ins, m, extra, detail, orient, canon, by_ptxas in hits:
        loc = _where(fn, ins)
        key = (kind, loc)
        g = groups.setdefault(key, {"ins": [], "m": m, "extra": extra, "detail": detail, "orient": orient,
                                    "canon": canon, "by_ptxas": by_ptxas})
        if ins not in g["ins"]:
            g["ins"].append(ins)
    out = []
    for (kind, loc), g in groups.items():
        ins_list = sorted(g["ins"], key=lambda i: i.lineno)
        related = [("rounded product", _fmt(_where(fn, g["m"])))]
        if g["extra"] is not None:
            role = "contracted product" if kind == COMPARE else "max/min reduction"
            related.append((role, _fmt(_where(fn, g["extra"]))))
        detail = g["detail"] + (" (mul and add carry no rounding modifier: ptxas may fuse them)"
                                if g["by_ptxas"] else "")
        out.append(Finding(
            kernel=kernel, kind=kind, source=_fmt(loc),
            source_text=linecache.getline(loc[0], loc[1]).strip() if loc else "",
            ptx_lines=tuple(i.lineno for i in ins_list), ptx_text=tuple(i.text for i in ins_list[:4]),
            related=tuple(related), fix=FIXES[kind], detail=detail, orientation=g["orient"],
            multiplicands=tuple(g["canon"]), by_ptxas=g["by_ptxas"]))
    out.sort(key=lambda f: (f.source, f.kind))
    return tuple(out)


def scan(kernel, signature_or_example_args, constexprs=None, *, target="sm_90", enable_fp_fusion=True,
         num_warps=4, num_stages=3) -> Report:
    """Compile ``kernel`` for ``target`` on the CPU and scan its PTX (and LLVM IR) for hazards.

    ``signature_or_example_args``: ``{arg: "*fp32" | "i32" | "fp32" ...}`` or example launch arguments
    (a list, or ``{arg: value}``; tensors give pointer types by dtype). ``constexprs``: values for the
    ``tl.constexpr`` parameters (defaults are used for those left out)."""
    from .compile import compile_kernel
    asm = compile_kernel(kernel, signature_or_example_args, constexprs, target=target,
                         enable_fp_fusion=enable_fp_fusion, num_warps=num_warps, num_stages=num_stages)
    return scan_ptx(asm.ptx, kernel=asm.name, llir=asm.llir, target=asm.target, enable_fp_fusion=enable_fp_fusion)
