"""Unpack llama.cpp's source (vendor/llama.cpp) from a downloaded llama-cpp-python sdist: `nox -s reference`."""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path


def main() -> None:
    folder, target = Path(sys.argv[1]), Path(sys.argv[2])
    (sdist,) = folder.glob("llama_cpp_python-*.tar.gz")
    prefix = f"{sdist.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
        for member in members:
            member.name = member.name[len(prefix) :]
        archive.extractall(target, members=[m for m in members if m.name], filter="data")
    print(f"{target}: llama.cpp {len(members)} files from {sdist.name}")


if __name__ == "__main__":
    main()
