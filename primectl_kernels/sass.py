"""Static instruction counts of a compiled kernel's main loop, read from its SASS (or PTX).

Pure Python (no torch / triton): ``primectl_kernels.compile_check`` feeds it the text of
``nvdisasm -c`` on a cubin, or the PTX when no disassembler is at hand.

The main loop is the widest backward branch: for the decode kernels that is the
loop over tiles of selected rows (Triton unrolls everything inside a tile, so
it is the only loop besides the ones ptxas leaves in helper subroutines).  The
body is counted statically: every instruction between the branch target and the
backward branch, once, whatever the predicates.  Subroutines the body ``CALL``s
(e.g. ``__cuda_sm20_div_s64`` for a 64-bit division) run on every call, so their
size is reported beside the body (``call_instructions``: callee size x calls).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

# one SASS instruction line of nvdisasm / cuobjdump: "/*0af0*/   @!P1 BRA `(.L_x_3) ;"
_SASS_INSN = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;?\s*$")
_SASS_LABEL = re.compile(r"^([.$\w]+):")
# nvdisasm -g: '//## File "/x/primectl_kernels/decode.py", line 223' (optionally ', inlined at ...')
_SASS_LINE = re.compile(r'^//## File "([^"]+)", line (\d+)')
_SASS_TARGET = re.compile(r"`\(([.$\w]+)\)")
_PRED = re.compile(r"^@!?U?P[0-9T]\s+")
# PTX: "$L__BB0_3:" labels, "@%p1 bra $L__BB0_3;" / "bra.uni $L__BB0_3;"
_PTX_LABEL = re.compile(r"^(\$L__\w+):")
_PTX_BRA = re.compile(r"^(?:@!?%\w+\s+)?bra(?:\.uni)?\s+(\$L__\w+)\s*;")

# opcode classes printed by the compile check (SASS opcodes up to the first '.')
SASS_CLASSES: dict[str, frozenset[str]] = {
    "mma": frozenset({"HMMA", "HGMMA", "IMMA", "QMMA", "UTCHMMA", "UTCQMMA", "UTCIMMA", "UTCOMMA"}),
    "smem": frozenset({"LDS", "STS", "LDSM", "STSM", "LDGSTS", "ATOMS"}),
    "gmem": frozenset({"LDG", "STG", "LD", "ST", "UBLKCP", "UTMALDG"}),
    "lmem": frozenset({"LDL", "STL"}),  # local memory: register spills / stack
    "cvt": frozenset({"F2F", "F2FP", "I2F", "F2I", "I2FP", "F2IP", "FRND"}),
    "shfl": frozenset({"SHFL"}),
    "bar": frozenset({"BAR", "WARPSYNC", "SYNCS", "MEMBAR"}),
    "int": frozenset({"IMAD", "IADD3", "LOP3", "SHF", "PRMT", "LEA", "ISETP", "SEL", "MOV", "VIADD", "IMNMX", "VIMNMX"}),
    "fp": frozenset({"FADD", "FMUL", "FFMA", "FMNMX", "FSEL", "FSETP", "HADD2", "HMUL2", "HFMA2", "HMNMX2", "MUFU", "FMNMX3"}),
}


@dataclass
class LoopStats:
    """Instruction counts of one kernel's main loop (``instructions == 0``: no loop found)."""

    source: str  # "sass" or "ptx"
    total_instructions: int = 0
    instructions: int = 0  # static size of the loop body
    calls: int = 0  # CALL instructions in the body
    call_instructions: int = 0  # sum over the body's calls of the callee's size
    classes: dict[str, int] = field(default_factory=dict)
    opcodes: dict[str, int] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)  # "file.py:line" -> body instructions (with nvdisasm -g)

    @property
    def effective(self) -> int:
        """Body plus the subroutines it calls: what one iteration issues at most, per thread."""
        return self.instructions + self.call_instructions


def _opcode(text: str) -> str:
    """``'@!P1 LDG.E.128 R4, ...'`` -> ``'LDG'``."""
    body = _PRED.sub("", text.strip())
    return body.split(None, 1)[0].split(".", 1)[0] if body else ""


def _loop_span(positions: list[tuple[int, str | None]], labels: dict[str, int]) -> tuple[int, int] | None:
    """Widest backward branch among (position, branch target) pairs: (first, last) position of its body."""
    best: tuple[int, int] | None = None
    for pos, target in positions:
        if target is None or target not in labels:
            continue
        start = labels[target]
        if start < pos and (best is None or pos - start > best[1] - best[0]):
            best = (start, pos)
    return best


def sass_loop_stats(sass: str) -> LoopStats:
    """Count the main loop of a kernel in ``nvdisasm -c`` output."""
    insns: list[tuple[int, str]] = []  # (index, text)
    where: list[str] = []  # source line of each instruction ("" without line info)
    labels: dict[str, int] = {}
    here = ""
    for line in sass.splitlines():
        s = line.strip()
        if s.startswith("//"):
            m = _SASS_LINE.match(s)
            if m:
                here = f"{m.group(1).rsplit('/', 1)[-1]}:{m.group(2)}"
            continue
        if not s:
            continue
        m = _SASS_LABEL.match(s)
        if m and not s.startswith("/*"):
            labels[m.group(1)] = len(insns)
            continue
        m = _SASS_INSN.match(line)
        if m:
            insns.append((len(insns), m.group(2)))
            where.append(here)
    stats = LoopStats("sass", total_instructions=len(insns))
    branches = [(i, (m.group(1) if (m := _SASS_TARGET.search(t)) else None)) for i, t in insns if _opcode(t) == "BRA"]
    span = _loop_span(branches, labels)
    if span is None:
        return stats
    body = insns[span[0] : span[1] + 1]
    ops = Counter(_opcode(t) for _, t in body)
    stats.instructions = len(body)
    stats.opcodes = dict(ops.most_common())
    stats.classes = {name: sum(ops[o] for o in members) for name, members in SASS_CLASSES.items()}
    stats.lines = dict(Counter(w for w in where[span[0] : span[1] + 1] if w).most_common())
    for _, text in body:
        if _opcode(text) != "CALL":
            continue
        stats.calls += 1
        tgt = _SASS_TARGET.search(text)
        if tgt and tgt.group(1) in labels:
            stats.call_instructions += _callee_size(insns, labels[tgt.group(1)])
    return stats


def _callee_size(insns: list[tuple[int, str]], start: int) -> int:
    """Instructions of a subroutine from its label to its first RET (inclusive)."""
    for i in range(start, len(insns)):
        if _opcode(insns[i][1]) == "RET":
            return i - start + 1
    return len(insns) - start


def ptx_loop_stats(ptx: str) -> LoopStats:
    """Count the main loop in PTX (the fallback when no SASS disassembler is available): PTX
    instructions between the loop's label and its backward ``bra``."""
    insns: list[str] = []
    labels: dict[str, int] = {}
    for line in ptx.splitlines():
        s = line.split("//", 1)[0].strip()
        if not s:
            continue
        m = _PTX_LABEL.match(s)
        if m:
            labels[m.group(1)] = len(insns)
            continue
        if s.endswith(";") and not s.startswith(".") and not s.startswith("{") and not s.startswith("}"):
            insns.append(s)
    stats = LoopStats("ptx", total_instructions=len(insns))
    branches = [(i, (m.group(1) if (m := _PTX_BRA.match(t)) else None)) for i, t in enumerate(insns)]
    span = _loop_span(branches, labels)
    if span is None:
        return stats
    body = insns[span[0] : span[1] + 1]
    ops = Counter(re.sub(r"^@!?%\w+\s+", "", t).split(None, 1)[0].split(".", 1)[0] for t in body)
    stats.instructions = len(body)
    stats.opcodes = dict(ops.most_common())
    stats.classes = {
        "mma": ops["mma"] + ops["wgmma"] + ops["tcgen05"],
        "smem": ops["ld"] + ops["st"] + ops["ldmatrix"] + ops["stmatrix"],  # PTX does not tell shared from global here
        "shfl": ops["shfl"],
        "bar": ops["bar"] + ops["barrier"],
        "cvt": ops["cvt"],
    }
    stats.calls = ops["call"]
    return stats
