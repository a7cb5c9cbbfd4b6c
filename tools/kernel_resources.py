"""What ptxas makes of one kernel family file, without a GPU: each kernel's registers, spills and shared memory,
optionally against another revision of the file and with counts from its SASS.

    python tools/kernel_resources.py packages/minfer-kernels/csrc/kernels/attention.cu --match attention_decode
    python tools/kernel_resources.py .../attention.cu --match attention_decode --against main
    python tools/kernel_resources.py .../attention.cu --match "attention_decode<128, false>" --sass build/sass
    python tools/kernel_resources.py .../gemv_int8.cu --match "Int8Q6_K, minfer::StoreRows<1, false>" --loops

The file is compiled as the build compiles it for the H200 (CMake's flags, sm_90 as sm_90a), so what it prints is
what the device runs. --against REV compiles the file as it is at git revision REV (its headers too) beside it.
--sass DIR also writes each matched kernel's SASS to DIR and counts what a kernel's time hides in: local-memory
loads and stores (spills), block barriers, and the instructions in all. --loops lists each kernel's innermost
loops (a backward branch's stretch holding no other) of 16 instructions or more (the shorter are spin-waits and
byte copies): the instructions an iteration issues, and its tensor-core instructions, shared- and global-memory
loads and shuffles. Both need cuobjdump and nvdisasm: from the CUDA toolkit on PATH, or
NVIDIA's PyPI wheels, which --fetch downloads into .reference/ (ignored).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = Path("packages/minfer-kernels")
# packages/minfer-kernels/cmake/MinferCuda.cmake's flags for sm_90 (less -fPIC and -lineinfo, which change no code).
NVCC_FLAGS = ["-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-DMINFER_SM90A_SASS=1"]
INCLUDES = ["csrc", "csrc/kernels"]
TOOLS = ROOT / ".reference" / "cuda-binutils"
WHEELS = ["nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm"]  # cuobjdump -sass runs nvdisasm


@dataclass
class Kernel:
    registers: int
    spill_stores: int
    spill_loads: int
    stack: int
    shared: int
    sass: str = ""


def fail(message: str) -> None:
    print(f"kernel_resources: {message}", file=sys.stderr)
    sys.exit(1)


def demangle(names: list[str]) -> list[str]:
    """C++ names, anonymous namespaces and parameter lists left out; the mangled ones where c++filt is missing."""
    if shutil.which("c++filt") is None:
        return names
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return [without_parameters(re.sub(r"(\w+::)*\(anonymous namespace\)::", "", line)) for line in out.splitlines()]


def without_parameters(name: str) -> str:
    """A demangled function name less its parameter list: the balanced (...) that ends it."""
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0:
            return name[:i] if name.endswith(")") else name
    return name


def compile_file(kernels_dir: Path, source: Path, out: Path) -> dict[str, Kernel]:
    """The file compiled to `out`, and ptxas's report of each kernel, by mangled name."""
    if shutil.which("nvcc") is None:
        fail("nvcc is not on PATH")
    command = ["nvcc", *NVCC_FLAGS, *(f"-I{kernels_dir / d}" for d in INCLUDES), "--resource-usage", "-c"]
    done = subprocess.run([*command, str(source), "-o", str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"nvcc failed on {source}:\n{done.stderr}")
    kernels, name, spills = {}, None, (0, 0, 0)
    for line in done.stderr.splitlines():
        if match := re.search(r"Function properties for (\S+)", line):
            name = match.group(1)
        elif match := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            spills = tuple(int(g) for g in match.groups())
        elif (match := re.search(r"Used (\d+) registers", line)) and name:
            shared = re.search(r"(\d+) bytes smem", line)  # absent where the kernel has none
            shared_bytes = int(shared[1]) if shared else 0
            kernels[name] = Kernel(int(match.group(1)), spills[1], spills[2], spills[0], shared_bytes)
            name, spills = None, (0, 0, 0)
    return kernels


def fetched_tools() -> dict[str, Path]:
    """The binaries of NVIDIA's wheels unpacked in .reference/, by name."""
    return {p.name: p for p in TOOLS.glob("nvidia/*/bin/*")}


def cuobjdump(fetch: bool) -> list[str]:
    """The command that dumps SASS: cuobjdump and nvdisasm from PATH, or from NVIDIA's wheels in .reference/
    (downloaded there first with fetch)."""
    if shutil.which("cuobjdump") and shutil.which("nvdisasm"):
        return ["cuobjdump"]
    if len(fetched_tools()) < 2 and fetch:
        with tempfile.TemporaryDirectory() as folder:
            download = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", folder, *WHEELS]
            if subprocess.run(download).returncode != 0:
                fail(f"pip could not download {' and '.join(WHEELS)}")
            for wheel in Path(folder).glob("*.whl"):
                zipfile.ZipFile(wheel).extractall(TOOLS)
        for tool in fetched_tools().values():
            tool.chmod(0o755)
    tools = fetched_tools()
    if "cuobjdump" not in tools or "nvdisasm" not in tools:
        fail(f"--sass needs cuobjdump and nvdisasm: the CUDA toolkit's on PATH, or --fetch (PyPI's into {TOOLS})")
    return ["env", f"NVDISASM_PATH={tools['nvdisasm'].parent}", str(tools["cuobjdump"])]


def add_sass(kernels: dict[str, Kernel], objects: Path, dump_command: list[str]) -> None:
    """Each kernel's SASS from the compiled object (kernels by mangled name)."""
    done = subprocess.run([*dump_command, "-sass", str(objects)], capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"cuobjdump failed on {objects}:\n{done.stderr}")
    dump = done.stdout
    for part in re.split(r"\n\s*Function : ", dump)[1:]:
        name, _, body = part.partition("\n")
        if name.strip() in kernels:
            kernels[name.strip()].sass = body


SASS_LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+([^;]*);")  # an instruction: its address, its text
PREDICATE = r"@!?U?P\w+\s+"
SASS_COUNTED = {"STL": r"\bSTL\b", "LDL": r"\bLDL\b", "BAR.SYNC": r"\bBAR\.SYNC\b"}


def sass_counts(sass: str) -> str:
    lines = [line for line in sass.splitlines() if SASS_LINE.match(line)]
    counts = [
        f"{sum(bool(re.search(pattern, line)) for line in lines)} {name}" for name, pattern in SASS_COUNTED.items()
    ]
    return ", ".join([f"{len(lines)} instructions", *counts])


MIN_LOOP = 16
# Opcodes counted in a loop (its first word, the predicate left out): HFMA2.MMA is an FMA, not an MMA.
LOOP_COUNTED = {"MMA": r"[A-Z]*MMA", "LDS": r"LDS", "LDG": r"LDG", "SHFL": r"SHFL"}


def innermost_loops(sass: str) -> list[tuple[int, list[str]]]:
    """The kernel's innermost loops, in address order: each backward branch's stretch of instructions (from the
    branch's target to the branch) that holds no other such stretch, as (first address, its instructions)."""
    instructions = [(int(m[1], 16), m[2].strip()) for line in sass.splitlines() if (m := SASS_LINE.match(line))]
    spans = set()
    for address, text in instructions:
        branch = re.match(rf"({PREDICATE})?BRA(\.\w+)*\s+(0x[0-9a-f]+)$", text)
        if branch and int(branch[3], 16) <= address:
            spans.add((int(branch[3], 16), address))
    inner = [(a, b) for a, b in spans if not any((c, d) != (a, b) and a <= c and d <= b for c, d in spans)]
    return [(a, [text for address, text in instructions if a <= address <= b]) for a, b in sorted(inner)]


def loop_counts(loop: list[str]) -> str:
    opcodes = [re.sub(f"^{PREDICATE}", "", text).split()[0].split(".")[0] for text in loop]
    counts = [f"{sum(bool(re.fullmatch(p, op)) for op in opcodes)} {name}" for name, p in LOOP_COUNTED.items()]
    return f"{len(loop)} instructions ({', '.join(counts)})"


def describe(kernel: Kernel) -> str:
    spills = f", {kernel.spill_stores} B spilled ({kernel.spill_loads} B reloaded)" if kernel.spill_stores else ""
    return f"{kernel.registers} registers{spills}, {kernel.shared} B static shared"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a kernel family file: packages/minfer-kernels/csrc/kernels/*.cu")
    parser.add_argument("--match", default="", help="only the kernels whose C++ name holds this text")
    parser.add_argument("--against", metavar="REV", help="the same file at this git revision, beside it")
    parser.add_argument("--sass", type=Path, metavar="DIR", help="write the matched kernels' SASS here, and count it")
    parser.add_argument("--loops", action="store_true", help="list each matched kernel's innermost loops (its SASS)")
    parser.add_argument("--fetch", action="store_true", help="download cuobjdump into .reference/ where it is missing")
    args = parser.parse_args()

    source = args.source.resolve()
    kernels_dir = ROOT / KERNELS
    if not source.is_file() or kernels_dir.resolve() not in source.parents:
        fail(f"{args.source}: not a file under {KERNELS}")
    dump_command = cuobjdump(args.fetch) if args.sass or args.loops else []
    with tempfile.TemporaryDirectory() as folder:
        trees = {"": (kernels_dir, source)}
        if args.against:
            old = Path(folder) / "old"
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.against, "--", str(KERNELS / "csrc")],
                                     capture_output=True)  # fmt: skip
            if archive.returncode != 0:
                fail(f"--against {args.against}: {archive.stderr.decode().strip()}")
            old.mkdir()
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
            old_source = old / source.relative_to(ROOT)
            if not old_source.is_file():
                fail(f"--against {args.against}: {source.relative_to(ROOT)} is not in that revision")
            trees[args.against] = (old / KERNELS, old_source)
        reports = {}
        for label, (tree, file) in trees.items():
            objects = Path(folder) / f"{len(reports)}.o"
            reports[label] = compile_file(tree, file, objects)
            if dump_command:
                add_sass(reports[label], objects, dump_command)
            # By C++ name: the mangled one of a kernel in an anonymous namespace differs between two trees.
            reports[label] = dict(zip(demangle(list(reports[label])), reports[label].values(), strict=True))

    shown = sorted(name for report in reports.values() for name in report if args.match in name)
    if not shown:
        fail(f"no kernel of {args.source} matches {args.match!r}")
    if args.sass:
        args.sass.mkdir(parents=True, exist_ok=True)
    for pretty in dict.fromkeys(shown):
        print(pretty)
        for label, report in reports.items():
            kernel = report.get(pretty)
            tag = f"  {label or 'this tree'}:"
            if kernel is None:
                print(f"{tag} (no such kernel)")
                continue
            print(f"{tag} {describe(kernel)}" + (f"; {sass_counts(kernel.sass)}" if kernel.sass else ""))
            if args.loops:
                for first, loop in innermost_loops(kernel.sass):
                    if len(loop) >= MIN_LOOP:
                        print(f"    loop at {first:#06x}: {loop_counts(loop)}")
            if args.sass and kernel.sass:
                stem = re.sub(r"[^\w]+", "_", pretty).strip("_")
                (args.sass / f"{stem}{'.' + label.replace('/', '-') if label else ''}.sass").write_text(kernel.sass)


if __name__ == "__main__":
    main()
