"""minfer's tokenizers against llama.cpp's own test vectors: the vocabulary-only GGUFs in llama.cpp's
`models/` (ggml-vocab-*.gguf) with their inputs (.inp) and the ids llama.cpp's test-tokenizer-0 expects
(.out): text with no BOS added and special tokens read as text, as that test encodes it.

`nox -s tests` downloads llama.cpp's source (the llama-cpp-python sdist) and names it in
$MINFER_LLAMA_CPP; without it these tests skip, saying so.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from minfer.gguf_file import GGUFFile
from minfer.tokenizer import Tokenizer

# The vocabularies of the families minfer runs: SentencePiece (Llama 2, Phi-3) and byte-level BPE (GPT-2,
# Qwen2 and Qwen3, Llama 3).
VOCABULARIES = ("llama-spm", "phi-3", "gpt-2", "qwen2", "llama-bpe")
SEPARATOR = "\n__ggml_vocab_test__\n"  # between two inputs of a .inp file (test-tokenizer-0's format)


def llama_cpp_models() -> Path:
    source = os.environ.get("MINFER_LLAMA_CPP")
    if not source:
        pytest.skip("MINFER_LLAMA_CPP names no llama.cpp source (nox -s tests downloads it)")
    return Path(source) / "models"


@pytest.mark.parametrize("name", VOCABULARIES)
def test_ids_equal_llama_cpps_test_vectors(name):
    path = llama_cpp_models() / f"ggml-vocab-{name}.gguf"
    tokenizer = Tokenizer.from_gguf(GGUFFile(path))
    texts = path.with_name(path.name + ".inp").read_text(encoding="utf-8").split(SEPARATOR)
    expected = path.with_name(path.name + ".out").read_text(encoding="utf-8").split("\n")
    assert len(texts) >= 40
    for text, line in zip(texts, expected, strict=False):
        ids = tokenizer.encode(text, add_bos=False, parse_special=False)
        assert ids == [int(t) for t in line.split()], f"{name}: {text!r}"
