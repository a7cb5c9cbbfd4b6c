"""Regenerate the SentencePiece tokenizer fixture: token ids from tokenizers that minfer did not write.

    python tools/make_spm_tokenizer_fixture.py --llama-cpp LLAMA_CPP_SOURCE [--gemma PATH] [--out PATH]

Vocabularies (`tokenizer.ggml.model = llama`):

- `sentencepiece-bpe`: a SentencePiece model trained here with the `sentencepiece` library (BPE with byte
  fallback, identity normalization, digits split, no whitespace collapsing: Llama 2's settings) on minfer's
  small corpus, saved as a Hugging Face model folder with added tokens (two control tokens, one user-defined)
  and converted by llama.cpp's own `convert_hf_to_gguf.py --vocab-only`. The fixture records every key the
  converter wrote, so the tests can write the same vocabulary again without sentencepiece or torch.
- `gemma3-270m`: the real Gemma 3 270M vocabulary (262144 tokens), `minfer pull gemma3`'s file.
- `synthetic-spm-gemma` / `synthetic-spm-llama2`: `minfer.testing.vocab.add_sentencepiece_metadata`'s
  vocabularies (the tests rebuild them and check `vocab_sha256`); `synthetic-spm-phi3`'s file is named like a
  Phi-3 model, whose special tokens llama.cpp gives the RSTRIP attribute.

The reference for every id list is llama.cpp (through llama-cpp-python, vocabulary only), the implementation
minfer's tokenizer follows. Cross-checks, each disagreement recorded in the fixture: `sentencepiece` itself on
the trained model (texts without added tokens: sentencepiece does not read those in text), transformers'
`LlamaTokenizer` built from that `tokenizer.model` (legacy spacing, llama.cpp's), and transformers' GGUF
tokenizer loading (`AutoTokenizer.from_pretrained(folder, gguf_file=...)`) on every file; each compares its
decoding of llama.cpp's ids with llama.cpp's too.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
from make_tokenizer_fixture import TEXTS, is_installed, to_json

from minfer.gguf_file import GGUFFile
from minfer.model_store import KNOWN_MODELS, locate
from minfer.testing.vocab import CORPUS, add_sentencepiece_metadata, build_sentencepiece_vocab

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "packages/minfer-runtime/tests/fixtures/tokenizer_spm_ids.json"
TRAINED_VOCAB_SIZE = 800
SYNTHETIC_VOCAB_SIZE = 2048
# name -> (style, general.architecture, general.name) of the synthetic files.
SYNTHETIC = {
    "synthetic-spm-gemma": ("gemma", "gemma3", None),
    "synthetic-spm-llama2": ("llama2", "llama", None),
    "synthetic-spm-phi3": ("phi3", "phi3", "Phi-3-mini (minfer synthetic)"),
}
# Added to the trained model through tokenizer_config.json, as chat fine-tunes add theirs: (text, special).
ADDED_TOKENS = (("<|im_start|>", True), ("<|im_end|>", True), ("<think>", False))

# Beyond the byte-level fixture's texts: the special tokens and whitespace of SentencePiece families.
SPM_TEXTS = [
    "<start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nHi<end_of_turn>",
    "text<end_of_turn>more text",
    "<s>[INST] What is 2+2? [/INST]",
    "<s> leading space after BOS</s>",
    "a</s>b<s>c",
    "</s>  two spaces after EOS\n",
    "<s>\t\tafter BOS, </s>\n\nand after EOS",
    "<|user|>\nHi<|end|>\n<|assistant|>\n",
    "<|system|> \t system text<|end|>  <|endoftext|>  end",
    "<unk> and <pad> and <mask>",
    "<think>reasoning</think> answer",
    "before <think> after",
    "<table><tr><td>cell</td></tr></table>",
    "<b>bold</b> and <i>italic</i>",
    "two\n\nnewlines, three\n\n\n, tab\t\ttabs",
    "  two spaces,   three,    four,\t\t\ttabs\n\n",
    "\u2581 a literal space symbol \u2581\u2581",
    "<0x41> is not a byte token in text",
    "ﬁ ligature, Ⅸ roman, ＡＢＣ fullwidth",
    " leading space",
    "trailing space ",
    "\n\nleading newlines",
]
LONG_TEXT = " ".join(CORPUS.split())[:3000]  # one line of prose and code: more than 512 tokens in every vocabulary

CROSS_CHECK_NOTES = [
    "sentencepiece agrees with llama.cpp wherever it applies: it reads no added token in text, so texts with "
    "one are left out of its check.",
    "transformers' Metaspace pre-tokenizer puts the space prefix only in front of a piece that does not start "
    "with a space already, and legacy=False (transformers' default) only at the start of the text; llama.cpp "
    "(and sentencepiece's add_dummy_prefix) always add it. This shows on texts starting with a space, or with a "
    "space after a special token.",
    "transformers runs a SentencePiece vocabulary as BPE over merges it recovers from the vocabulary, ordered by "
    "score (by id for Gemma); llama.cpp and sentencepiece merge by the score of each candidate pair's token. "
    "The two differ on some runs of whitespace (`▁▁▁`), where several merges make the same token.",
    "llama.cpp makes `</s>` a control token in every vocabulary (it ends generation on it); Gemma 3's is a "
    "user-defined HTML tag, which transformers matches whole even when special tokens are not parsed.",
    "llama.cpp gives the special tokens of a file whose general.name says Phi-3 the RSTRIP attribute (each "
    "swallows the whitespace after it); transformers' GGUF loading does not.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp's source (for its converter)")
    parser.add_argument("--gemma", type=Path, help="the Gemma 3 270M GGUF (default: `minfer pull gemma3`'s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if importlib.util.find_spec("llama_cpp") is None:
        sys.exit("the reference needs llama-cpp-python: pip install llama-cpp-python (it compiles llama.cpp)")
    for package in ("sentencepiece", "transformers"):
        if not is_installed(package):
            sys.exit(f"the cross-checks need {package}: pip install {package}")
    texts = [*TEXTS, *SPM_TEXTS, LONG_TEXT]
    if len(set(texts)) != len(texts):
        sys.exit("the texts must be distinct")
    gemma = args.gemma or locate(KNOWN_MODELS["gemma3"])
    if gemma is None:
        sys.exit("the Gemma 3 vocabulary needs its file: minfer pull gemma3")

    vocabularies: dict[str, dict] = {}
    disagreements: list[dict] = []
    checked: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        trained, model_folder = convert_trained_model(folder, args.llama_cpp)
        sources = {
            "sentencepiece-bpe": (trained, f"sentencepiece-trained BPE model converted by {args.llama_cpp.name}"),
            "gemma3-270m": (gemma, f"{KNOWN_MODELS['gemma3'].requirement}: {KNOWN_MODELS['gemma3'].filename}"),
        }
        for name, (style, architecture, general_name) in SYNTHETIC.items():
            sources[name] = (
                write_synthetic(folder / f"{name}.gguf", style, architecture, general_name),
                f"minfer.testing.vocab.add_sentencepiece_metadata(writer, {SYNTHETIC_VOCAB_SIZE}, style={style!r})",
            )
        for name, (path, description) in sources.items():
            print(f"{name}: tokenizing {len(texts)} texts", file=sys.stderr)
            cross_checks = {"transformers (GGUF)": transformers_from_gguf(path)}
            if name == "sentencepiece-bpe":
                cross_checks["sentencepiece"] = SentencePieceReference(model_folder / "tokenizer.model")
                cross_checks["transformers (tokenizer.model)"] = transformers_from_model(model_folder)
            cases = tokenize_all(LlamaCppReference(path), texts)
            found, checked[name] = compare(name, cases, cross_checks)
            disagreements += found
            vocabularies[name] = vocabulary_entry(name, path, description, cases)
    fixture = {
        "generated_by": "tools/make_spm_tokenizer_fixture.py",
        "reference": llama_cpp_info(),
        "cross_checks": {
            "packages": [package_info("sentencepiece", "sentencepiece"), package_info("transformers", "transformers")],
            "notes": CROSS_CHECK_NOTES,
            "texts_checked": checked,
            "disagreements": disagreements,
        },
        "encode": "add_bos=False; `ids` with special tokens parsed, `ids_no_special` with them read as text",
        "vocabularies": vocabularies,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(to_json(fixture), encoding="utf-8")
    print(f"wrote {args.out}: {len(disagreements)} cross-check disagreements", file=sys.stderr)


class LlamaCppReference:
    def __init__(self, path: Path) -> None:
        from llama_cpp import Llama

        self._model = Llama(str(path), vocab_only=True, verbose=False)

    def encode(self, text: str, parse_special: bool) -> list[int]:
        return self._model.tokenize(text.encode("utf-8"), add_bos=False, special=parse_special)

    def decode(self, ids: list[int]) -> str:
        """llama.cpp's detokenizer itself (llama-cpp-python's `detokenize` joins pieces by its own rule), with
        special tokens shown and none removed, as minfer's `decode` does."""
        import ctypes

        import llama_cpp

        array = (llama_cpp.llama_token * len(ids))(*ids)
        size = 16 * len(ids) + 16
        buffer = ctypes.create_string_buffer(size)
        vocab = self._model._model.vocab
        n = llama_cpp.llama_detokenize(vocab, array, len(ids), buffer, size, False, True)
        if n < 0:
            size = -n
            buffer = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(vocab, array, len(ids), buffer, size, False, True)
        return buffer.raw[:n].decode("utf-8", errors="replace")


class SentencePieceReference:
    """sentencepiece itself: it matches no control or added token in text (so `parse_special` is moot)."""

    def __init__(self, model: Path) -> None:
        import sentencepiece

        self._processor = sentencepiece.SentencePieceProcessor(model_file=str(model))

    def applies_to(self, text: str) -> bool:
        return not any(token in text for token, _ in (*ADDED_TOKENS, ("<s>", True), ("</s>", True), ("<unk>", True)))

    def encode(self, text: str, parse_special: bool) -> list[int]:
        return self._processor.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self._processor.decode(ids)


class TransformersReference:
    def __init__(self, tokenizer: object) -> None:
        self._tokenizer = tokenizer

    def applies_to(self, text: str) -> bool:
        return True

    def encode(self, text: str, parse_special: bool) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False, split_special_tokens=not parse_special)

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids)


def transformers_from_gguf(path: Path) -> TransformersReference:
    from transformers import AutoTokenizer

    return TransformersReference(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name))


def transformers_from_model(folder: Path) -> TransformersReference:
    from transformers import LlamaTokenizer

    return TransformersReference(LlamaTokenizer.from_pretrained(str(folder), legacy=True))


def convert_trained_model(folder: Path, llama_cpp: Path) -> tuple[Path, Path]:
    """Train the SentencePiece model, save it as a model folder and convert it: (the GGUF, the folder)."""
    import sentencepiece

    model_folder = folder / "sentencepiece-bpe"
    model_folder.mkdir()
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(line for line in CORPUS.splitlines() if line.strip()),
        model_writer=model,
        vocab_size=TRAINED_VOCAB_SIZE,
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        add_dummy_prefix=True,
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    (model_folder / "tokenizer.model").write_bytes(model.getvalue())
    n_pieces = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue()).vocab_size()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": n_pieces + len(ADDED_TOKENS),
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (model_folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    added = {
        str(token_id): {"content": text, "special": special}
        for token_id, (text, special) in [(0, ("<unk>", True)), (1, ("<s>", True)), (2, ("</s>", True))]
        + [(n_pieces + index, token) for index, token in enumerate(ADDED_TOKENS)]
    }
    tokenizer_config = {
        "tokenizer_class": "LlamaTokenizer",
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "legacy": True,
        "added_tokens_decoder": {
            token_id: entry | {"lstrip": False, "rstrip": False, "normalized": False, "single_word": False}
            for token_id, entry in added.items()
        },
    }
    (model_folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    converted = folder / "sentencepiece-bpe.gguf"
    converter = llama_cpp / "convert_hf_to_gguf.py"
    subprocess.run([sys.executable, converter, "--vocab-only", "--outfile", converted, model_folder], check=True)
    return converted, model_folder


def write_synthetic(path: Path, style: str, architecture: str, general_name: str | None) -> Path:
    writer = gguf.GGUFWriter(path, architecture)
    if general_name is not None:
        writer.add_name(general_name)
    add_sentencepiece_metadata(writer, SYNTHETIC_VOCAB_SIZE, style=style)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def synthetic_vocab_sha256(vocab_size: int, style: str) -> str:
    """A digest of the synthetic tokens, scores and types (the tests compute the same)."""
    tokens, scores, token_types = build_sentencepiece_vocab(vocab_size, style)
    content = json.dumps([tokens, scores, [int(t) for t in token_types]], ensure_ascii=False)
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def tokenize_all(reference: LlamaCppReference, texts: list[str]) -> list[dict]:
    cases = []
    for text in texts:
        case = {"text": text, "ids": reference.encode(text, parse_special=True)}
        no_special = reference.encode(text, parse_special=False)
        if no_special != case["ids"]:
            case["ids_no_special"] = no_special
        case["decoded"] = reference.decode(case["ids"])
        cases.append(case)
    return cases


def compare(vocabulary: str, cases: list[dict], cross_checks: dict[str, object]) -> tuple[list[dict], dict]:
    """Every way the cross-checks' ids and decoded text differ from llama.cpp's, and how many texts each
    checked."""
    disagreements = []
    checked = dict.fromkeys(cross_checks, 0)
    for case in cases:
        for name, other in cross_checks.items():
            if not other.applies_to(case["text"]):
                continue
            checked[name] += 1
            found = {"vocabulary": vocabulary, "cross_check": name, "text": case["text"]}
            for key, parse_special in (("ids", True), ("ids_no_special", False)):
                expected = case.get(key, case["ids"])
                if (theirs := other.encode(case["text"], parse_special)) != expected:
                    what = {"what": "ids", "parse_special": parse_special}
                    disagreements.append(found | what | {"reference": expected, "theirs": theirs})
            if (decoded := other.decode(case["ids"])) != case["decoded"]:
                disagreements.append(found | {"what": "decode", "reference": case["decoded"], "theirs": decoded})
    return disagreements, checked


def vocabulary_entry(name: str, path: Path, description: str, cases: list[dict]) -> dict:
    entry: dict = {"source": description}
    if name == "gemma3-270m":
        entry["file_sha256"] = KNOWN_MODELS["gemma3"].sha256
    elif name == "sentencepiece-bpe":
        entry["keys"] = converter_keys(path)
    else:
        style, architecture, general_name = SYNTHETIC[name]
        entry |= {
            "style": style,
            "architecture": architecture,
            "general_name": general_name,
            "vocab_size": SYNTHETIC_VOCAB_SIZE,
            "vocab_sha256": synthetic_vocab_sha256(SYNTHETIC_VOCAB_SIZE, style),
        }
    entry["cases"] = cases
    return entry


def converter_keys(path: Path) -> list[list]:
    """The converter's `general.architecture` and `tokenizer.*` keys as [key, value type, element type, value]."""
    file = GGUFFile(path)
    return [
        [key, kind.type.name, kind.element.name if kind.element else None, file.metadata[key]]
        for key, kind in file.value_types.items()
        if key.startswith("tokenizer.") or key == "general.architecture"
    ]


def llama_cpp_info() -> dict[str, str]:
    """The version of llama-cpp-python, which pins the llama.cpp it compiles (read from the module: a build
    against a separately compiled libllama, LLAMA_CPP_LIB_PATH, has no installed distribution)."""
    import llama_cpp

    return {"name": "llama.cpp", "package": "llama-cpp-python", "version": llama_cpp.__version__}


def package_info(name: str, package: str) -> dict[str, str | None]:
    version = importlib.metadata.version(package) if is_installed(package) else None
    return {"name": name, "package": package, "version": version}


if __name__ == "__main__":
    main()
