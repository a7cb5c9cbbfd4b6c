"""Check that the docs' code references still point at something: `path/to/file.py: symbol` and `file::test`.

Run by `nox -s docs`. A reference is a backticked path to a file of this repository
(packages/..., tools/..., docs/..., or minfer/... for the runtime package), optionally
followed by `: name` or `::name`; the file must exist and, if a name is given, define it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALIASES = {"minfer/": "packages/minfer-runtime/src/minfer/"}
REFERENCE = re.compile(
    r"`((?:packages|tools|docs|minfer)/[\w./-]+\.(?:py|md|cu|cpp|h|cuh|sh|toml))"  # a repository file
    r"(?:(?::|::) ?([\w.]+))?"  # optionally, a symbol it defines
)


def resolve(path: str) -> Path:
    for alias, target in ALIASES.items():
        if path.startswith(alias):
            return ROOT / (target + path[len(alias) :])
    return ROOT / path


def check(doc: Path) -> list[str]:
    problems = []
    for line_number, line in enumerate(doc.read_text().splitlines(), 1):
        for path, name in REFERENCE.findall(line):
            target = resolve(path)
            where = f"{doc.relative_to(ROOT)}:{line_number}"
            if not target.exists():
                problems.append(f"{where}: `{path}` does not exist")
            elif name and not re.search(rf"\b{re.escape(name.split('.')[-1])}\b", target.read_text()):
                problems.append(f"{where}: `{path}` does not define `{name}`")
    return problems


def main() -> int:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    problems = [p for doc in docs for p in check(doc)]
    for problem in problems:
        print(problem)
    print(f"checked {len(docs)} documents: {len(problems)} broken references")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
