"""Which kernels two builds of a CUDA file compile to the same SASS: the check, without a GPU, that a change leaves
as they were the kernels it does not mean to touch (docs/PERFORMANCE.md, session 49: row 81's kernels without
X_AHEAD, 151 of 151 main's SASS).

    nvcc -std=c++17 -arch=sm_90a -O3 -Ipackages/minfer-kernels/csrc -Ipackages/minfer-kernels/csrc/kernels \\
        -c packages/minfer-kernels/csrc/kernels/gemv.cu -o /tmp/new.o        (and OLD.o from the other tree)
    python3 tools/sass_compare.py OLD.o NEW.o [--map-new REGEX REPLACEMENT] [--list]

Each object's SASS comes from `cuobjdump -sass` (the CUOBJDUMP environment variable names it where CUDA's is not
on PATH: the `nvidia-cuda-cuobjdump` wheel has one); a `.sass` file is read as cuobjdump's output already. Kernels
are matched by mangled name, the anonymous namespace's per-file hash left out, and compared instruction by
instruction as cuobjdump prints them (offsets and branch targets are within the kernel, so two equal kernels print
the same text). --map-new rewrites NEW's names before matching (Python's re.sub), for a change that adds a
template parameter: `--map-new 'Lb0E(EEvN)' '\\1'` matches `gemv<F, E, false>` to the old `gemv<F, E>`. A NEW
kernel that matches no OLD one after the mapping (`gemv<F, E, true>`, the new code) is counted apart.

Prints the counts (the same, different, only in OLD, only in NEW); --list adds the names of each group but the
first, demangled where c++filt is on PATH. Exits 0, or 1 where a kernel found in both differs or none matches.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

FUNCTION = re.compile(r"^\s*Function : (\S+)")
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
NAMESPACE_HASH = re.compile(r"(_GLOBAL__N__)([0-9a-f]+)_")  # the anonymous namespace's hash: differs build to build


def read_sass(path: Path) -> str:
    """cuobjdump's SASS of an object, or the text of a `.sass` file."""
    if path.suffix == ".sass":
        return path.read_text()
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if tool is None:
        raise SystemExit(
            "sass_compare: no cuobjdump on PATH; set CUOBJDUMP (pip download nvidia-cuda-cuobjdump --no-deps, "
            "unzip: nvidia/cu13/bin/cuobjdump)"
        )
    done = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"sass_compare: {tool} -sass {path} failed: {done.stderr.strip()}")
    return done.stdout


def kernels(sass: str) -> dict[str, tuple[str, ...]]:
    """Each kernel's instructions (text without address or encoding), by mangled name without the namespace hash."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in sass.splitlines():
        if match := FUNCTION.match(line):
            # The hash as zeros of its length: the name stays a mangled name c++filt reads.
            name = NAMESPACE_HASH.sub(lambda hashed: hashed[1] + "0" * len(hashed[2]) + "_", match.group(1))
            current = found.setdefault(name, [])
        elif current is not None and (match := INSTRUCTION.match(line)):
            current.append(match.group(1))
    return {name: tuple(body) for name, body in found.items()}


def demangled(names: list[str]) -> list[str]:
    """The names as c++filt writes them, or as they are where there is none."""
    if not names or shutil.which("c++filt") is None:
        return names
    done = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return done.stdout.splitlines() if done.returncode == 0 else names


def compare(
    old: dict[str, tuple[str, ...]], new: dict[str, tuple[str, ...]], mapping: tuple[str, str] | None
) -> dict[str, list[str]]:
    """The kernels by outcome: same and different (names as in OLD), only in OLD, only in NEW (names as in NEW)."""
    groups: dict[str, list[str]] = {"same": [], "different": [], "only in OLD": [], "only in NEW": []}
    matched = set()
    for name, body in new.items():
        old_name = re.sub(mapping[0], mapping[1], name) if mapping else name
        if old_name not in old or old_name in matched:
            groups["only in NEW"].append(name)
            continue
        matched.add(old_name)
        groups["same" if old[old_name] == body else "different"].append(old_name)
    groups["only in OLD"] = [name for name in old if name not in matched]
    return groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="the object (or .sass) before the change")
    parser.add_argument("new", type=Path, help="the object (or .sass) after it")
    parser.add_argument("--map-new", nargs=2, metavar=("REGEX", "REPLACEMENT"), help="rewrite NEW's names")
    parser.add_argument("--list", action="store_true", help="name the kernels of each group but the same")
    args = parser.parse_args(argv)
    for path in (args.old, args.new):
        if not path.is_file():
            raise SystemExit(f"sass_compare: cannot read {path}: no such file")
    old, new = kernels(read_sass(args.old)), kernels(read_sass(args.new))
    if not old or not new:
        empty = args.old if not old else args.new
        raise SystemExit(f"sass_compare: {empty} holds no kernel's SASS")
    groups = compare(old, new, tuple(args.map_new) if args.map_new else None)
    if not groups["same"] and not groups["different"]:
        raise SystemExit(f"sass_compare: no kernel of {args.new} matches one of {args.old} (builds of one file?)")
    print(", ".join(f"{len(names)} {group}" for group, names in groups.items()))
    if args.list:
        for group, names in groups.items():
            if group != "same" and names:
                print(f"{group}:")
                for name in demangled(names):
                    print(f"  {name}")
    return 1 if groups["different"] else 0


if __name__ == "__main__":
    sys.exit(main())
