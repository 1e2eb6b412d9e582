"""PTX as a list of instructions with def-use chains and Python source locations.

What the parser keeps per instruction: the PTX line number, the opcode split on ``.``
(``fma.rn.f32`` -> base ``fma``, modifiers ``("rn", "f32")``), the guard predicate, destination and
source registers (vector operands ``{%r1, %r2}`` and ``%r|%p`` pairs expanded; address operands
``[...]`` kept apart), and the current ``.loc`` (file, line, column, inlined-at).

Def-use: NVPTX emits virtual registers, so almost every register has one definition; loop-carried
values (phis lowered to ``mov``) have several, and a use depends on all of them. Shared memory is
linked conservatively: an ``ld.shared`` reads every ``st.shared`` of the barrier epoch just before it
and of its own epoch (the warp-reduction and layout-conversion round trips Triton emits). Registers
declared inside an inline-asm ``{ }`` scope are renamed per scope so they never alias.

Source lines: ``.loc F L C, ..., inlined_at F2 L2 C2`` gives one inlining level; deeper chains are
resolved through the inlined-at of earlier ``.loc`` lines for the same position, until a file that
is not part of Triton/torch (the user's kernel) is reached.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Iterator

__all__ = ["Loc", "Instr", "PtxFunction", "parse_ptx", "FLOAT_TYPES"]

FLOAT_TYPES = frozenset({"f32", "f16", "bf16", "f64", "f16x2", "bf16x2", "f32x2"})
ROUNDING = frozenset({"rn", "rz", "rm", "rp"})
_NO_DEST = frozenset({"st", "red", "bar", "barrier", "bra", "ret", "exit", "trap", "fence", "membar",
                      "prefetch", "prefetchu", "cp", "stmatrix", "call", "brx", "pmevent", "griddepcontrol",
                      "setmaxnreg", "tensormap", "discard", "applypriority", "nanosleep"})
_BARRIERS = frozenset({"bar", "barrier"})
_LOC_RE = re.compile(r"\.loc\s+(\d+)\s+(\d+)\s+(\d+)(?:.*?inlined_at\s+(\d+)\s+(\d+)\s+(\d+))?")
_FILE_RE = re.compile(r'\.file\s+(\d+)\s+"([^"]*)"(?:\s*,?\s*"([^"]*)")?')
_REG_RE = re.compile(r"^[%$A-Za-z_][\w$.]*$")
_IMM_RE = re.compile(r"^-?(0[fFdD][0-9a-fA-F]+|0[xX][0-9a-fA-F]+U?|\d+(\.\d*)?([eE][-+]?\d+)?U?)$")


@dataclasses.dataclass(frozen=True)
class Loc:
    """A ``.loc`` position: file id, line, column, and the position it was inlined at (if any)."""
    file: int
    line: int
    col: int
    inlined_at: tuple[int, int, int] | None = None
    chain: tuple[tuple[str, int], ...] = ()  # (file name, line) of the inlining frames, from the comment


@dataclasses.dataclass(frozen=True)
class Instr:
    idx: int
    lineno: int
    text: str
    base: str
    mods: tuple[str, ...]
    pred: str | None
    dests: tuple[str, ...]
    srcs: tuple[str, ...]
    args: tuple
    addr: tuple[str, ...]
    loc: Loc | None

    @property
    def opcode(self) -> str:
        return ".".join((self.base,) + self.mods)

    @property
    def ftype(self) -> str | None:
        """The floating-point type of the instruction, if any (``f32``...)."""
        for m in reversed(self.mods):
            if m in FLOAT_TYPES:
                return m
        return None

    @property
    def rounding(self) -> str | None:
        for m in self.mods:
            if m in ROUNDING:
                return m
        return None

    @property
    def space(self) -> str | None:
        for m in self.mods:
            if m.startswith(("shared", "global", "local", "param", "const")):
                return m.split("::")[0]
        return None


class PtxFunction:
    """One ``.entry`` of a PTX module: instructions, def-use chains, source files."""

    def __init__(self, name: str, instrs: list[Instr], files: dict[int, str], text_lines: list[str],
                 labels: dict[str, int] | None = None):
        self.name = name
        self.instrs = instrs
        self.files = files
        self.lines = text_lines
        self.labels = dict(labels or {})
        self.defs: dict[str, list[Instr]] = {}
        for ins in instrs:
            for d in ins.dests:
                self.defs.setdefault(d, []).append(ins)
        self._reach = _reaching_definitions(instrs, self.labels)
        self._smem_links = _link_shared(instrs)
        self._inline_map = _inline_map(instrs)

    # -- dataflow -----------------------------------------------------------------------------------
    def producers(self, reg: str, at: Instr | None = None) -> list[Instr]:
        """Definitions of ``reg`` that reach its use in ``at`` (all definitions when ``at`` is None)."""
        if at is None:
            return self.defs.get(reg, [])
        mask = self._reach.get((at.idx, reg))
        if mask is None:
            return self.defs.get(reg, [])
        return [d for d in self.defs.get(reg, []) if mask >> d.idx & 1]

    def shared_sources(self, ld: Instr) -> list[str]:
        """Registers stored by the ``st.shared`` instructions an ``ld.shared`` may read."""
        out = []
        for st in self._smem_links.get(ld.idx, ()):
            out.extend(st.srcs)
        return out

    # -- source locations ---------------------------------------------------------------------------
    def file_of(self, file_id: int) -> str:
        return self.files.get(file_id, f"<file {file_id}>")

    def user_location(self, loc: Loc | None) -> tuple[str, int] | None:
        """(path, line) of the innermost frame of ``loc`` that lies outside Triton/torch sources."""
        if loc is None:
            return None
        frame: tuple[int, int, int] | None = (loc.file, loc.line, loc.col)
        parent = loc.inlined_at
        for _ in range(16):
            path = self.file_of(frame[0])
            if not _is_library(path):
                return path, frame[1]
            if parent is None:
                parent = self._inline_map.get(frame)
            if parent is None:
                break
            frame, parent = parent, None
        for name, line in loc.chain:  # inlining frames named in the .loc comment (file names only)
            for path in self.files.values():
                if os.path.basename(path) == name and not _is_library(path):
                    return path, line
        return self.file_of(loc.file), loc.line


def _is_library(path: str) -> bool:
    p = path.replace("\\", "/")
    return "/triton/language/" in p or "/triton/runtime/" in p or "/torch/_inductor/runtime/" in p


def _inline_map(instrs: list[Instr]) -> dict:
    out = {}
    for ins in instrs:
        if ins.loc is not None and ins.loc.inlined_at is not None:
            out[(ins.loc.file, ins.loc.line, ins.loc.col)] = ins.loc.inlined_at
    return out


_TERMINATORS = frozenset({"bra", "ret", "exit", "trap", "brx"})


def _reaching_definitions(instrs: list[Instr], labels: dict[str, int]) -> dict:
    """(use instruction idx, register) -> bitmask (over instruction indices) of the definitions of
    the register that reach that use.

    Only registers with several definitions are tracked (the others are in SSA form already).
    Basic blocks start at labels and after branches; ``@p bra`` falls through too. A predicated
    definition does not kill earlier ones (``mov %r, 0; @p ld %r`` leaves both reaching)."""
    n = len(instrs)
    defmask: dict[str, int] = {}
    count: dict[str, int] = {}
    for ins in instrs:
        for d in ins.dests:
            count[d] = count.get(d, 0) + 1
            defmask[d] = defmask.get(d, 0) | (1 << ins.idx)
    multi = {r for r, c in count.items() if c > 1}
    if not multi:
        return {}
    leaders = {0} | {i for i in labels.values() if i < n}
    leaders |= {i + 1 for i, ins in enumerate(instrs) if ins.base in _TERMINATORS and i + 1 < n}
    starts = sorted(leaders)
    blocks = [(st, starts[b + 1] if b + 1 < len(starts) else n) for b, st in enumerate(starts)]
    block_at = {st: b for b, (st, _) in enumerate(blocks)}
    succ: list[list[int]] = [[] for _ in blocks]
    for b, (st, end) in enumerate(blocks):
        last = instrs[end - 1]
        if last.base == "bra" and last.args and isinstance(last.args[0], str) and last.args[0] in labels:
            tgt = block_at.get(labels[last.args[0]])
            if tgt is not None:
                succ[b].append(tgt)
        if (last.base not in _TERMINATORS or (last.base == "bra" and last.pred)) and b + 1 < len(blocks):
            succ[b].append(b + 1)
    preds: list[list[int]] = [[] for _ in blocks]
    for b, ss in enumerate(succ):
        for t in ss:
            preds[t].append(b)
    kills = {i: defmask[d] for i, ins in enumerate(instrs) for d in ins.dests if d in multi}

    def transfer(b, state, record=None):
        st, end = blocks[b]
        for i in range(st, end):
            ins = instrs[i]
            if record is not None:
                for r in ins.srcs:
                    if r in multi:
                        record[(i, r)] = state & defmask[r]
            if i in kills:
                for d in ins.dests:
                    if d in multi:
                        state = (state | (1 << i)) if ins.pred else ((state & ~defmask[d]) | (1 << i))
        return state

    outs = [0] * len(blocks)
    work, queued = list(range(len(blocks))), set(range(len(blocks)))
    while work:
        b = work.pop(0)
        queued.discard(b)
        state = 0
        for p_ in preds[b]:
            state |= outs[p_]
        new = transfer(b, state)
        if new != outs[b]:
            outs[b] = new
            for t in succ[b]:
                if t not in queued:
                    work.append(t)
                    queued.add(t)
    reach: dict = {}
    for b in range(len(blocks)):
        state = 0
        for p_ in preds[b]:
            state |= outs[p_]
        transfer(b, state, reach)
    return {k: v for k, v in reach.items() if v}


def _link_shared(instrs: list[Instr]) -> dict[int, list[Instr]]:
    """ld.shared idx -> st.shared instructions of the previous and current barrier epochs."""
    links: dict[int, list[Instr]] = {}
    epochs: list[list[Instr]] = [[]]
    for ins in instrs:
        if ins.base in _BARRIERS:
            epochs.append([])
        elif ins.base == "st" and ins.space == "shared":
            epochs[-1].append(ins)
        elif ins.base == "ld" and ins.space == "shared":
            prev = epochs[-2] if len(epochs) > 1 else []
            links[ins.idx] = prev + epochs[-1]
    return links


def _split_operands(s: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def _regs_in(op: str) -> list[str]:
    """Register names in one operand: ``%r1``, ``{%r1, %r2}``, ``%r1|%p1``, ``-%r1`` (immediates dropped)."""
    op = op.strip().strip("{}()")
    out = []
    for part in re.split(r"[,|]", op):
        t = part.strip().lstrip("-!")
        if t and not _IMM_RE.match(t) and _REG_RE.match(t):
            out.append(t)
    return out


def _statements(text: str) -> Iterator[tuple[int, str]]:
    """(line number, statement) with comments removed; ``{``/``}`` come as their own statements."""
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("//", 1)[0].strip()
        if not line:
            continue
        if line.startswith(".loc"):
            yield lineno, raw.strip()  # keep the comment: triton 3.6's LLVM writes inlining only there
            continue
        if line.startswith(".file"):
            yield lineno, line
            continue
        for piece in line.split(";"):
            piece = piece.strip()
            while piece[:1] in ("{", "}"):  # scope braces open a statement; operand braces never do
                yield lineno, piece[0]
                piece = piece[1:].strip()
            tail = []
            while piece.endswith("}") and piece.count("}") > piece.count("{"):
                tail.append("}")
                piece = piece[:-1].strip()
            if piece:
                yield lineno, piece
            yield from ((lineno, t) for t in tail)


def parse_ptx(text: str, name: str | None = None) -> PtxFunction:
    """Parse the (first, or named) ``.entry`` of a PTX module."""
    files = {}
    for m in _FILE_RE.finditer(text):
        d, f = m.group(2), m.group(3)
        files[int(m.group(1))] = os.path.join(d, f) if f else d
    instrs: list[Instr] = []
    entry = None
    depth = 0
    in_body = False
    loc = None
    scopes: list[dict[str, str]] = []
    scope_counter = 0
    labels: dict[str, int] = {}
    pending_entry = None
    for lineno, st in _statements(text):
        if not in_body:
            m = re.search(r"\.entry\s+([\w$]+)", st)
            if m:
                pending_entry = m.group(1)
            if st == "{" and pending_entry is not None and (name is None or pending_entry == name) and entry is None:
                entry, in_body, depth = pending_entry, True, 1
                scopes = [{}]
            continue
        if st == "{":
            depth += 1
            scope_counter += 1
            scopes.append({"@id": str(scope_counter)})
            continue
        if st == "}":
            depth -= 1
            scopes.pop()
            if depth == 0:
                break
            continue
        if st.startswith(".loc"):
            code, _, comment = st.partition("//")
            m = _LOC_RE.match(code.strip())
            if m:
                inl = tuple(int(g) for g in m.group(4, 5, 6)) if m.group(4) else None
                frames = re.findall(r"([\w.\-]+):(\d+):\d+", comment)[1:] if "@[" in comment else []
                loc = Loc(int(m.group(1)), int(m.group(2)), int(m.group(3)), inl,
                          tuple((f, int(n)) for f, n in frames))
            continue
        if st.startswith(".reg") and depth > 1:
            for nm in re.findall(r"([%$A-Za-z_][\w$]*)(?:<(\d+)>)?", st.split(None, 2)[-1]):
                base, count = nm
                names = [f"{base}{i}" for i in range(int(count))] if count else [base]
                for n in names:
                    scopes[-1][n] = f"{n}@{scopes[-1]['@id']}"
            continue
        if st.endswith(":"):
            labels[st[:-1].strip()] = len(instrs)
            continue
        if st.startswith("."):
            continue  # directives
        instrs.append(_parse_instr(len(instrs), lineno, st, loc, scopes))
    if entry is None:
        raise ValueError("no .entry function found in the PTX" + (f" named {name!r}" if name else ""))
    return PtxFunction(entry, instrs, files, text.splitlines(), labels)


def _parse_instr(idx: int, lineno: int, st: str, loc: Loc | None, scopes) -> Instr:
    pred = None
    if st.startswith("@"):
        pred, st = st.split(None, 1)
        pred = pred[1:]
    parts = st.split(None, 1)
    opcode = parts[0]
    ops = _split_operands(parts[1]) if len(parts) > 1 else []
    base, *mods = opcode.split(".")

    def ren(r):
        for sc in reversed(scopes):
            if r in sc:
                return sc[r]
        return r

    dests: list[str] = []
    srcs: list[str] = []
    addr: list[str] = []
    args: list = []
    for i, op in enumerate(ops):
        if op.startswith("["):
            regs = [ren(r) for r in _regs_in(op.strip("[]").replace("+", ","))]
            addr.extend(regs)
            args.append("[" + ",".join(regs) + "]")
            continue
        regs = [ren(r) for r in _regs_in(op)]
        if i == 0 and base not in _NO_DEST:
            dests.extend(regs)
            if base in ("wgmma", "mma", "tcgen05"):
                srcs.extend(regs)  # accumulate in place
            continue
        srcs.extend(regs)
        if op.startswith("{"):
            args.append(tuple(regs))
        else:
            t = op.strip()
            args.append(regs[0] if regs and len(regs) == 1 and "|" not in t else _norm_imm(t))
    if pred:
        srcs.append(ren(pred.lstrip("!")))
    return Instr(idx, lineno, " ".join(st.split()), base, tuple(mods), pred, tuple(dests), tuple(srcs), tuple(args), tuple(addr),
                 loc)


def _norm_imm(t: str) -> str:
    """Immediates in one spelling: hex float ``0f3F800000`` upper-cased; others as written."""
    if len(t) > 2 and t[0] == "0" and t[1] in "fFdD":
        return "0" + t[1].lower() + t[2:].upper()
    return t
