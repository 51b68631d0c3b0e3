#!/usr/bin/env python3
"""Atomic read-modify-writes executed per request, from a callgrind file written with
`--dump-instr=yes` (loadtest/instructions.sh with ATOMICS=1).

Callgrind counts instructions, and an atomic read-modify-write is one instruction like any
other, but on these machines it costs tens of cycles (a full barrier). This counts them: every
executed instruction of the gateway's binary and its libraries whose bytes carry a `lock`
prefix, or are an `xchg` with memory (locked without the prefix), or an `mfence`.

Usage: atomics.py FILE.cg REQUESTS [TOP]
Prints the total per request, then the TOP (default 12) functions with the most.
"""
import collections
import re
import struct
import sys

PREFIXES = {0xF0, 0xF2, 0xF3, 0x2E, 0x36, 0x3E, 0x26, 0x64, 0x65, 0x66, 0x67}


def executed(path):
    """(object, function, address) -> times executed."""
    names = {"ob": {}, "fn": {}}
    counts = collections.Counter()
    ob = fn = None
    last = 0
    after_call = False

    def name(kind, text):
        m = re.match(r"\((\d+)\)(?: (.*))?", text)
        if not m:
            return text
        if m.group(2) is not None:
            names[kind][m.group(1)] = m.group(2)
        return names[kind].get(m.group(1), "?")

    for line in open(path):
        line = line.rstrip("\n")
        if not line:
            continue
        key, _, rest = line.partition("=")
        if key in ("ob", "cob"):
            v = name("ob", rest)
            ob = v if key == "ob" else ob
        elif key in ("fn", "cfn"):
            v = name("fn", rest)
            fn = v if key == "fn" else fn
        elif key == "calls":
            after_call = True  # the next cost line is the call's inclusive cost
        elif line[0] in "0123456789+-*":
            tok = line.split()
            pos = tok[0]
            if pos == "*":
                addr = last
            elif pos[0] in "+-":
                addr = last + int(pos, 0)
            else:
                addr = int(pos, 0)
            last = addr
            if after_call:
                after_call = False
            elif len(tok) >= 3:
                counts[(ob, fn, addr)] += int(tok[2])
    return counts


class Elf:
    """An ELF file's loadable segments, to read the bytes at an address."""

    def __init__(self, path):
        self.data = open(path, "rb").read()
        phoff = struct.unpack_from("<Q", self.data, 0x20)[0]
        size, num = struct.unpack_from("<HH", self.data, 0x36)
        self.segments = []
        for i in range(num):
            kind, _, off, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", self.data, phoff + i * size)
            if kind == 1:
                self.segments.append((vaddr, off, filesz))

    def at(self, addr):
        for vaddr, off, size in self.segments:
            if vaddr <= addr < vaddr + size:
                start = off + addr - vaddr
                return self.data[start:start + 16]
        return b""


def atomic(code):
    i, locked = 0, False
    while i < len(code) and code[i] in PREFIXES:
        locked |= code[i] == 0xF0
        i += 1
    if locked:
        return True
    if i < len(code) and 0x40 <= code[i] <= 0x4F:  # REX
        i += 1
    if i + 1 < len(code) and code[i] in (0x86, 0x87) and code[i + 1] >> 6 != 3:
        return True  # xchg with a memory operand
    return code[i:i + 3] == b"\x0f\xae\xf0"  # mfence


def main():
    path, requests = sys.argv[1], int(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    elves = {}
    by_fn = collections.Counter()
    for (ob, fn, addr), n in executed(path).items():
        if ob not in elves:
            try:
                elves[ob] = Elf(ob)
            except (OSError, struct.error):
                elves[ob] = None
        if elves[ob] and atomic(elves[ob].at(addr)):
            by_fn[fn] += n
    print(f"{sum(by_fn.values()) / requests:.1f}")
    for fn, n in by_fn.most_common(top):
        print(f"  {n / requests:6.2f}  {fn[:140]}", file=sys.stderr)


if __name__ == "__main__":
    main()
