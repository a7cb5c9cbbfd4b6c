"""Check that the docs' code references still point at something: `path/to/file.py: symbol` and `file::test`.

Run by `nox -s docs`. A reference is a backticked path to a file of this repository (packages/..., tools/...,
docs/..., or the short forms minfer/... for the runtime package, minfer_kernels/... and csrc/... for the
kernels package), optionally followed by `: name` or `::name`. The file must exist and, if a name is given,
*define* it (each part of a dotted `Class.method`): a `def`, a `class`, an assignment or enum member in Python;
a function, kernel, struct, macro or constant in C, C++ and CUDA; a `function()` in CMake, a function or
variable in shell. A name that the file only mentions (in a comment, a call) does not count.

It also fails on a document that points outside the repository (a relative link or path that leaves it) and
on a `<<H200:name>>` placeholder, an output of docs/tutorial/toys/run-on-gpu.sh not pasted in yet.

Checked: README.md, every Markdown file under docs/ and each package's README.md.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALIASES = {
    "minfer/": "packages/minfer-runtime/src/minfer/",
    "minfer_kernels/": "packages/minfer-kernels/src/minfer_kernels/",
    "csrc/": "packages/minfer-kernels/csrc/",
}
REFERENCE = re.compile(
    r"`((?:packages|tools|docs|minfer|minfer_kernels|csrc)/[\w./-]+\.(?:py|md|cuh|cu|hpp|h|cpp|sh|toml|cmake|txt))(?!\w)"
    r"(?:(?::|::) ?([\w.]+))?"  # optionally, a symbol it defines
)
LINK = re.compile(r"\]\(([^)#\s]+)")  # a Markdown link's target
OUTSIDE_PATH = re.compile(r"`(\.\./[^`\s]+)")  # a backticked relative path going up
PLACEHOLDER = re.compile(r"<<H200:[^>]*>>")


def python_definition(name: str) -> re.Pattern[str]:
    # def / class, or an assignment (annotated or not, enum members included) at the start of a line.
    return re.compile(
        rf"^[ \t]*(?:(?:async[ \t]+)?def|class)[ \t]+{name}\b|^[ \t]*{name}[ \t]*(?::[^=\n]+)?=[^=]", re.M
    )


C_QUALIFIERS = (
    r"(?:(?:template[ \t]*<[^>\n]*>|__global__|__device__|__host__|__forceinline__|static|inline|constexpr"
    r"|extern[ \t]+\"C\"|\[\[noreturn\]\]|virtual|explicit)[ \t]+)*"
)
C_NOT_A_TYPE = {"return", "else", "throw", "case", "new", "delete", "goto", "sizeof", "co_return"}


def c_definition(name: str) -> Callable[[str], bool]:
    """A C/C++/CUDA definition or declaration of `name`: a function or kernel (a return type before it, or
    typed parameters after it), a struct/class/enum/union, a #define, or a constant / enum member."""
    function = re.compile(
        rf"^[ \t]*{C_QUALIFIERS}(?P<type>(?:[\w:<>,]+[ \t*&]+)*?)(?:__launch_bounds__\([^)\n]*\)[ \t]+)?"
        rf"(?:\w+::)*{name}[ \t]*\((?P<params>[^)\n]*)",
        re.M,
    )
    typed_parameter = re.compile(r"^[ \t]*(?:const[ \t]+)?[\w:<>]+(?:[ \t*&]+(?:const|__restrict__)?)*[ \t*&]+\w+")
    others = re.compile(
        rf"^[ \t]*(?:template[ \t]*<[^>\n]*>[ \t]*)?(?:struct|class|enum(?:[ \t]+class)?|union)[ \t]+{name}\b"
        rf"|^[ \t]*#[ \t]*define[ \t]+{name}\b"
        rf"|^[ \t]*(?:(?:static|inline|constexpr|const|using)[ \t]+)+[\w:<>\[\] \t*&]*\b{name}[ \t]*(?:=|\[|\{{)"
        rf"|^[ \t]*{name}[ \t]*(?:=[^=]|,)",
        re.M,
    )

    def defines(text: str) -> bool:
        for match in function.finditer(text):
            words = match["type"].split()
            if words and words[0] not in C_NOT_A_TYPE:
                return True
            params = match["params"]
            if not words and typed_parameter.match(params):  # a constructor, or a kernel whose type is above
                return True
            if not words and params.strip() in ("", "void") and not text[match.end() :].startswith(");"):
                return True  # `name() {`, not the call statement `name();`
        return bool(others.search(text))

    return defines


def definition(path: Path, name: str) -> Callable[[str], bool]:
    """Whether a file's text defines `name`, by the rules of the file's language."""
    suffix = path.suffix
    if suffix == ".py":
        return lambda text: bool(python_definition(name).search(text))
    if suffix in (".cu", ".cuh", ".h", ".hpp", ".cpp"):
        return c_definition(name)
    if suffix == ".cmake" or path.name == "CMakeLists.txt":
        pattern = re.compile(rf"^[ \t]*(?:function|macro)\([ \t]*{name}\b", re.M | re.I)
    elif suffix == ".sh":
        pattern = re.compile(rf"^[ \t]*(?:function[ \t]+)?{name}[ \t]*\(\)|^[ \t]*(?:export[ \t]+)?{name}=", re.M)
    elif suffix == ".toml":
        pattern = re.compile(rf"^[ \t]*(?:{name}[ \t]*=|\[[\w.-]*\b{name}\])", re.M)
    else:  # Markdown: a heading that names it
        pattern = re.compile(rf"^#+ .*\b{name}\b", re.M)
    return lambda text: bool(pattern.search(text))


def resolve(doc: Path, path: str) -> Path:
    """The file a reference names: a short form's package file, else a path from the repository root, or from
    the document's folder (a package README names its own files from there)."""
    for alias, target in ALIASES.items():
        if path.startswith(alias):
            return ROOT / (target + path[len(alias) :])
    from_root = ROOT / path
    return from_root if from_root.is_file() else doc.parent / path


def leaves_repository(doc: Path, target: str) -> bool:
    if re.match(r"^[a-z]+:", target):  # a URL
        return False
    resolved = (doc.parent / target).resolve()
    return not resolved.is_relative_to(ROOT)


def check(doc: Path) -> list[str]:
    problems = []
    for line_number, line in enumerate(doc.read_text().splitlines(), 1):
        where = f"{doc.relative_to(ROOT)}:{line_number}"
        for path, name in REFERENCE.findall(line):
            target = resolve(doc, path)
            if not target.is_file():
                problems.append(f"{where}: `{path}` does not exist")
                continue
            text = target.read_text()
            for part in name.split(".") if name else []:
                if not definition(target, re.escape(part))(text):
                    problems.append(f"{where}: `{path}` does not define `{part}`")
        for target in [*LINK.findall(line), *OUTSIDE_PATH.findall(line)]:
            if leaves_repository(doc, target):
                problems.append(f"{where}: `{target}` points outside the repository")
        for placeholder in PLACEHOLDER.findall(line):
            problems.append(f"{where}: {placeholder} is a placeholder for an output of run-on-gpu.sh")
    return problems


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted(ROOT.glob("packages/*/README.md"))]


def main() -> int:
    docs = documents()
    problems = [p for doc in docs for p in check(doc)]
    for problem in problems:
        print(problem)
    print(f"checked {len(docs)} documents: {len(problems)} broken references")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
