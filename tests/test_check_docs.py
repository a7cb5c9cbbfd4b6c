"""tools/check_docs.py: a cited name must be defined in the cited file, not merely mentioned there; no doc
may point outside the repository or keep a run-on-gpu.sh placeholder."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from tool_modules import tool_module


@pytest.fixture
def check_docs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """tools/check_docs.py with its repository root moved to an empty tmp_path."""
    with tool_module("check_docs") as module:
        monkeypatch.setattr(module, "ROOT", tmp_path)
        yield module


def write(root: Path, path: str, text: str) -> Path:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(textwrap.dedent(text))
    return target


PYTHON = '''
    """Mentions mentioned_only in a docstring."""
    import enum

    # comment_only is named here, in a comment
    class Op(enum.Enum):
        SILU = "silu"

    class Graph:
        def bind(self):
            return called_only()

    def schedule(graph) -> None: ...
    LIMIT: int = 3
'''

CUDA = """
    // comment_only: named in a comment
    namespace {
    constexpr int BLOCK = 256;
    __device__ __forceinline__ float silu(float v) { return v; }
    __global__ void silu_f32(float* x, int n) {
        x[0] = silu(x[0]);
        called_only(x, n);
    }
    template <int HEAD_DIM>
    __global__ void __launch_bounds__(128)
        attention_decode(const float* __restrict__ q, int n) {}
    struct GemvSwiglu {};
    class Buffer {
      public:
        explicit Buffer(std::size_t nbytes);
    };
    }
    extern "C" cudaError_t launch_silu_f32(float* x, int n, cudaStream_t stream) {
        silu_f32<<<1, BLOCK, 0, stream>>>(x, n);
        return cudaGetLastError();
    }
"""


@pytest.mark.parametrize(
    ("reference", "defined"),
    [
        ("minfer/m.py: schedule", True),
        ("minfer/m.py: Op.SILU", True),
        ("minfer/m.py: Graph.bind", True),
        ("minfer/m.py: LIMIT", True),
        ("minfer/m.py: comment_only", False),
        ("minfer/m.py: mentioned_only", False),
        ("minfer/m.py: called_only", False),
        ("minfer/m.py: Graph.called_only", False),
        ("csrc/kernels/k.cu: silu_f32", True),
        ("csrc/kernels/k.cu: silu", True),
        ("csrc/kernels/k.cu: launch_silu_f32", True),
        ("csrc/kernels/k.cu: attention_decode", True),
        ("csrc/kernels/k.cu: GemvSwiglu", True),
        ("csrc/kernels/k.cu: BLOCK", True),
        ("csrc/kernels/k.cu: Buffer", True),
        ("csrc/kernels/k.cu: comment_only", False),
        ("csrc/kernels/k.cu: called_only", False),
        ("csrc/kernels/k.cu: cudaGetLastError", False),
        ("packages/minfer-kernels/csrc/kernels/k.cu: silu_f32", True),
        ("packages/minfer-kernels/cmake/B.cmake: minfer_probe_archs", True),
        ("packages/minfer-kernels/cmake/B.cmake: MINFER_CUDA_ARCHS", False),
        ("tools/x.sh: run_step", True),
        ("tools/x.sh: wanted", False),
        ("packages/minfer-runtime/tests/test_t.py::test_defined", True),
        ("packages/minfer-runtime/tests/test_t.py::test_missing", False),
    ],
)
def test_a_cited_name_must_be_defined_in_the_cited_file(check_docs, tmp_path, reference, defined):
    write(tmp_path, "packages/minfer-runtime/src/minfer/m.py", PYTHON)
    write(tmp_path, "packages/minfer-kernels/csrc/kernels/k.cu", CUDA)
    write(tmp_path, "packages/minfer-kernels/cmake/B.cmake", "function(minfer_probe_archs)\n  # MINFER_CUDA_ARCHS\n")
    write(tmp_path, "tools/x.sh", "run_step() {\n    wanted kernels\n}\n")
    write(tmp_path, "packages/minfer-runtime/tests/test_t.py", "def test_defined():\n    assert True\n")
    doc = write(tmp_path, "docs/d.md", f"See `{reference}`.\n")
    problems = check_docs.check(doc)
    assert problems == [] if defined else len(problems) == 1 and "does not define" in problems[0], problems


def test_a_missing_file_is_reported(check_docs, tmp_path):
    doc = write(tmp_path, "docs/d.md", "`csrc/kernels/gone.cu: silu_f32`\n")
    assert check_docs.check(doc) == ["docs/d.md:1: `csrc/kernels/gone.cu` does not exist"]


def test_a_package_readme_names_its_files_from_its_folder(check_docs, tmp_path):
    write(tmp_path, "packages/minfer-chat/tools/shot.py", "def main():\n    pass\n")
    doc = write(tmp_path, "packages/minfer-chat/README.md", "`tools/shot.py: main`\n")
    assert check_docs.check(doc) == []


def test_pointers_outside_the_repository_and_placeholders_fail(check_docs, tmp_path):
    write(tmp_path, "docs/PERF.md", "# perf\n")
    doc = write(
        tmp_path,
        "docs/tutorial/t.md",
        """\
        [inside](../PERF.md) and [a site](https://developer.nvidia.com)
        [outside](../../../shared/ANCHORS.md) and `../../../shared/DESIGN.md`
        ```
        <<H200:silu.cu>>
        ```
        """,
    )
    problems = check_docs.check(doc)
    assert problems == [
        "docs/tutorial/t.md:2: `../../../shared/ANCHORS.md` points outside the repository",
        "docs/tutorial/t.md:2: `../../../shared/DESIGN.md` points outside the repository",
        "docs/tutorial/t.md:4: <<H200:silu.cu>> is a placeholder for an output of run-on-gpu.sh",
    ]


def test_the_documents_include_the_tutorial_and_the_package_readmes(check_docs, tmp_path):
    for path in ("README.md", "docs/A.md", "docs/tutorial/README.md", "packages/minfer-kernels/README.md"):
        write(tmp_path, path, "# x\n")
    names = [str(doc.relative_to(tmp_path)) for doc in check_docs.documents()]
    assert names == ["README.md", "docs/A.md", "docs/tutorial/README.md", "packages/minfer-kernels/README.md"]
