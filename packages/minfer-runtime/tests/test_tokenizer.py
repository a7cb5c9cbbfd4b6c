"""The byte-level BPE tokenizer: ids equal an independent reference, text survives the round trip."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import gguf
import pytest

from minfer.errors import TokenizerError
from minfer.gguf_file import GGUFFile
from minfer.testing.vocab import CORPUS, add_tokenizer_metadata, build_vocab
from minfer.tokenizer import PRE_TOKENIZERS, Tokenizer

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "tokenizer_ids.json").read_text(encoding="utf-8"))
SYNTHETIC = {name: entry for name, entry in FIXTURE["vocabularies"].items() if name.startswith("synthetic-")}
DEFAULT_MODEL = FIXTURE["vocabularies"]["smollm2-135m-instruct"]

IM_START, IM_END, ENDOFTEXT = 1, 2, 0  # ids of the ChatML tokens in every vocabulary used here


def write_gguf(path: Path, write_keys, architecture: str = "llama", name: str | None = None) -> Path:
    """A tokenizer-only GGUF: `write_keys(writer)` adds the metadata."""
    writer = gguf.GGUFWriter(path, architecture)
    if name is not None:
        writer.add_name(name)
    write_keys(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def synthetic_tokenizer(tmp_path: Path, vocab_size: int = 2048, **options) -> Tokenizer:
    path = write_gguf(tmp_path / "tokenizer.gguf", lambda w: add_tokenizer_metadata(w, vocab_size, **options))
    return Tokenizer.from_gguf(GGUFFile(path))


def custom_tokenizer(tmp_path: Path, *, model: str = "gpt2", pre: str = "smollm", retype=None) -> Tokenizer:
    """A synthetic vocabulary with chosen `model`/`pre` values and some tokens' text and type replaced.

    `retype` maps a token id to a new (text, token type).
    """
    tokens, token_types, merges = build_vocab(2048)
    for token_id, (text, token_type) in (retype or {}).items():
        tokens[token_id], token_types[token_id] = text, token_type

    def write_keys(writer: gguf.GGUFWriter) -> None:
        writer.add_tokenizer_model(model)
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        writer.add_token_types(token_types)
        writer.add_token_merges([f"{left} {right}" for left, right in merges])
        writer.add_bos_token_id(IM_START)
        writer.add_eos_token_id(IM_END)

    return Tokenizer.from_gguf(GGUFFile(write_gguf(tmp_path / "custom.gguf", write_keys)))


@pytest.fixture(scope="module")
def synthetic_tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tokenizer]:
    """The fixture's synthetic vocabularies, rebuilt with `minfer.testing.vocab`."""
    folder = tmp_path_factory.mktemp("vocabularies")
    return {
        name: Tokenizer.from_gguf(
            GGUFFile(
                write_gguf(
                    folder / f"{name}.gguf",
                    lambda w, e=entry: add_tokenizer_metadata(w, e["vocab_size"], pre=e["pre"]),
                )
            )
        )
        for name, entry in SYNTHETIC.items()
    }


@pytest.fixture(scope="module")
def default_tokenizer(default_model_gguf: GGUFFile) -> Tokenizer:
    return Tokenizer.from_gguf(default_model_gguf)


def vocab_sha256(vocab_size: int) -> str:
    """The same digest tools/make_tokenizer_fixture.py records for a synthetic vocabulary."""
    tokens, token_types, merges = build_vocab(vocab_size)
    content = json.dumps([tokens, [int(t) for t in token_types], merges], ensure_ascii=False)
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


# --- the fixture itself ---------------------------------------------------------------------------


def test_fixture_comes_from_an_independent_reference_and_covers_enough():
    assert FIXTURE["reference"]["name"] in ("llama.cpp", "transformers")
    assert FIXTURE["reference"]["version"]
    pres = {entry["pre"] for entry in FIXTURE["vocabularies"].values()}
    assert {"smollm", "qwen2", "llama-bpe", "gpt-2", "gpt-4o", "default"} <= pres
    texts = [case["text"] for case in DEFAULT_MODEL["cases"]]
    assert len(set(texts)) >= 50
    assert any("<|im_start|>" in text for text in texts)
    assert any(ord(char) > 0x1F000 for text in texts for char in text)  # emoji
    assert any("\u4e00" <= char <= "\u9fff" for text in texts for char in text)  # CJK


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_vocabulary_is_the_one_the_fixture_was_made_from(name):
    assert vocab_sha256(SYNTHETIC[name]["vocab_size"]) == SYNTHETIC[name]["vocab_sha256"], (
        "minfer.testing.vocab changed: regenerate the fixture with `nox -s tokenizer_fixture`"
    )


# --- ids equal the reference ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_ids_equal_reference(synthetic_tokenizers, name):
    tokenizer = synthetic_tokenizers[name]
    for case in SYNTHETIC[name]["cases"]:
        assert tokenizer.encode(case["text"], add_bos=False) == case["ids"], case["text"]
        if "ids_no_special" in case:
            assert tokenizer.encode(case["text"], add_bos=False, parse_special=False) == case["ids_no_special"]


def test_default_model_ids_equal_reference(default_tokenizer):
    for case in DEFAULT_MODEL["cases"]:
        assert default_tokenizer.encode(case["text"], add_bos=False) == case["ids"], case["text"]
        if "ids_no_special" in case:
            assert default_tokenizer.encode(case["text"], add_bos=False, parse_special=False) == case["ids_no_special"]


def test_default_model_known_ids(default_tokenizer):
    # Digits are split one by one under the `smollm` pre-tokenizer.
    assert default_tokenizer.encode("Hello world! 123") == [19556, 905, 17, 216, 33, 34, 35]
    assert default_tokenizer.vocab_size == 49152
    assert (default_tokenizer.bos_id, default_tokenizer.eos_id) == (IM_START, IM_END)
    assert default_tokenizer.add_bos is False  # the file says tokenizer.ggml.add_bos_token = false
    assert default_tokenizer.stop_ids == frozenset({ENDOFTEXT, IM_END})
    assert default_tokenizer.token_text(IM_END) == "<|im_end|>"


def test_default_model_builds_fast(default_model_gguf):
    start = time.perf_counter()
    Tokenizer.from_gguf(default_model_gguf)
    assert time.perf_counter() - start < 2.0  # about 0.3 s on a laptop; generous for a busy CI machine


# --- decoding -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_round_trip_on_fixture_texts(synthetic_tokenizers, name):
    tokenizer = synthetic_tokenizers[name]
    for case in SYNTHETIC[name]["cases"]:
        assert tokenizer.decode(tokenizer.encode(case["text"])) == case["text"]
        assert tokenizer.decode(case["ids"]) == case["text"]


def test_default_model_round_trip(default_tokenizer):
    for case in DEFAULT_MODEL["cases"]:
        assert default_tokenizer.decode(default_tokenizer.encode(case["text"])) == case["text"]


def stream(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    decoder = tokenizer.stream_decoder()
    return [decoder.feed(token_id) for token_id in ids] + [decoder.flush()]


@pytest.mark.parametrize(
    "text", ["🦙🚀✨ emoji 👨‍👩‍👧", "日本語のテキストです。你好，世界！", "mixed 한국어 and Ünïcödé 😀"]
)
def test_streamed_decoding_equals_full_decoding_and_never_breaks_a_character(synthetic_tokenizers, text):
    tokenizer = synthetic_tokenizers["synthetic-qwen2"]
    ids = tokenizer.encode(text)
    pieces = stream(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in piece for piece in pieces)
    # The test means something only if some character was split across tokens.
    assert "" in pieces[:-1]


def test_streamed_decoding_on_the_default_model(default_tokenizer):
    text = "🦙 日本語 👍🏽 café"
    ids = default_tokenizer.encode(text)
    pieces = stream(default_tokenizer, ids)
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_flush_emits_an_unfinished_character_as_a_replacement(synthetic_tokenizers):
    tokenizer = synthetic_tokenizers["synthetic-smollm"]
    ids = tokenizer.encode("🦙")
    assert len(ids) > 1
    decoder = tokenizer.stream_decoder()
    assert decoder.feed(ids[0]) == ""
    assert decoder.flush() == "\ufffd"
    assert decoder.feed(tokenizer.encode("ok")[0]) == "ok"  # flush starts a fresh stream


def test_token_bytes_and_text(synthetic_tokenizers):
    tokenizer = synthetic_tokenizers["synthetic-gpt-2"]
    (space_the,) = tokenizer.encode(" the")
    assert tokenizer.token_text(space_the) == "Ġthe"
    assert tokenizer.token_bytes(space_the) == b" the"
    assert tokenizer.token_bytes(IM_END) == b"<|im_end|>"


@pytest.mark.parametrize("bad_id", [-1, 2048, 10**9])
def test_out_of_range_ids_are_refused(synthetic_tokenizers, bad_id):
    tokenizer = synthetic_tokenizers["synthetic-smollm"]
    with pytest.raises(TokenizerError, match=rf"token id {bad_id} is out of range.*2048 tokens"):
        tokenizer.decode([5, bad_id])
    with pytest.raises(TokenizerError, match=r"\.gguf: token id"):
        tokenizer.stream_decoder().feed(bad_id)


# --- special tokens and BOS -----------------------------------------------------------------------


def test_special_tokens_are_matched_whole_only_when_parsing_special(synthetic_tokenizers):
    tokenizer = synthetic_tokenizers["synthetic-smollm"]
    text = "<|im_start|>user\nhi<|im_end|>"
    parsed = tokenizer.encode(text)
    assert parsed[0] == IM_START and parsed[-1] == IM_END
    plain = tokenizer.encode(text, parse_special=False)
    assert IM_START not in plain and IM_END not in plain
    assert len(plain) > len(parsed)
    assert tokenizer.decode(plain) == tokenizer.decode(parsed) == text


def test_special_tokens_glued_to_text(synthetic_tokenizers):
    tokenizer = synthetic_tokenizers["synthetic-qwen2"]
    ids = tokenizer.encode("a<|im_end|>b<|endoftext|><|endoftext|>")
    assert ids == [*tokenizer.encode("a"), IM_END, *tokenizer.encode("b"), ENDOFTEXT, ENDOFTEXT]


def test_user_defined_tokens_are_matched_even_without_parse_special(tmp_path):
    think = 2000  # a padding token, made into a user-defined `<think>`
    tokenizer = custom_tokenizer(tmp_path, retype={think: ("<think>", gguf.TokenType.USER_DEFINED)})
    for parse_special in (True, False):
        ids = tokenizer.encode("a <think>b", parse_special=parse_special)
        assert think in ids
        assert tokenizer.decode(ids) == "a <think>b"


def test_longest_special_token_wins(tmp_path):
    short = 2000
    tokenizer = custom_tokenizer(tmp_path, retype={short: ("<|im", gguf.TokenType.CONTROL)})
    assert tokenizer.encode("<|im_start|><|im") == [IM_START, short]


def test_bos_follows_the_file_and_is_never_doubled(tmp_path):
    tokenizer = synthetic_tokenizer(tmp_path, add_bos=True)
    assert tokenizer.add_bos is True
    hello = tokenizer.encode("hello", add_bos=False)
    assert tokenizer.encode("hello") == [IM_START, *hello]
    assert tokenizer.encode("<|im_start|>hello") == [IM_START, *hello]
    # Not parsed as special, the text does not start with BOS: BOS is added before it.
    plain = tokenizer.encode("<|im_start|>hello", parse_special=False)
    assert plain[0] == IM_START and plain[1] != IM_START
    assert tokenizer.encode("hello", add_bos=False) == hello


def test_bos_is_off_when_the_file_says_so(synthetic_tokenizers):
    tokenizer = synthetic_tokenizers["synthetic-smollm"]
    assert tokenizer.add_bos is False
    assert tokenizer.encode("hello")[0] != IM_START
    assert tokenizer.encode("hello", add_bos=True)[0] == IM_START
    assert tokenizer.encode("", add_bos=True) == [IM_START]
    assert tokenizer.encode("") == []


def test_stop_ids(tmp_path):
    tokenizer = synthetic_tokenizer(tmp_path)
    assert tokenizer.stop_ids == frozenset({IM_END, ENDOFTEXT})

    eot = 2000
    with_eot = custom_tokenizer(tmp_path, retype={eot: ("<|eot_id|>", gguf.TokenType.CONTROL)})
    assert with_eot.stop_ids == frozenset({IM_END, ENDOFTEXT, eot})


# --- every supported pre-tokenizer, on synthetic vocabularies -------------------------------------


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZERS))
def test_each_pre_tokenizer_round_trips_the_corpus(tmp_path, pre):
    tokenizer = synthetic_tokenizer(tmp_path, pre=pre)
    ids = tokenizer.encode(CORPUS)
    assert tokenizer.decode(ids) == CORPUS
    # Merges were learned from this corpus: it compresses well.
    assert len(ids) < len(CORPUS.encode("utf-8")) / 2


@pytest.mark.parametrize(
    ("pre", "expected"),
    [
        ("smollm", [" ", "2", "0", "2", "4", " ", "1", "2", "3", "4", "5"]),
        ("qwen2", [" ", "2", "0", "2", "4", " ", "1", "2", "3", "4", "5"]),
        ("llama-bpe", [" ", "202", "4", " ", "123", "45"]),
        ("gpt-2", [" 2024", " 12345"]),
        ("default", [" ", "202", "4", " ", "123", "45"]),
    ],
)
def test_digits_are_grouped_as_llama_cpp_does(synthetic_tokenizers, pre, expected):
    tokenizer = synthetic_tokenizers[f"synthetic-{pre}"]
    assert tokenizer.words(" 2024 12345") == expected
    for token_id in tokenizer.encode(" 2024 12345"):
        assert tokenizer.token_bytes(token_id).decode() in "".join(expected)


@pytest.mark.parametrize(
    ("pre", "expected"),
    [
        ("gpt-2", ["IT", "'", "S", " it", "'s"]),
        ("smollm", ["IT", "'", "S", " it", "'s"]),
        ("qwen2", ["IT", "'S", " it", "'s"]),
        ("llama-bpe", ["IT", "'S", " it", "'s"]),
    ],
)
def test_contractions(synthetic_tokenizers, pre, expected):
    # GPT-2's split knows only lowercase contractions; Llama 3's and Qwen2's any case.
    assert synthetic_tokenizers[f"synthetic-{pre}"].words("IT'S it's") == expected


def test_punctuation_and_whitespace_words(synthetic_tokenizers):
    text = "x  \n\n y!! (a)"
    assert synthetic_tokenizers["synthetic-gpt-2"].words(text) == ["x", "  \n\n", " y", "!!", " (", "a", ")"]
    # llama.cpp's "default" isolates punctuation runs first.
    assert synthetic_tokenizers["synthetic-default"].words(text) == ["x", "  \n\n", " y", "!!", " ", "(", "a", ")"]
    # Llama 3 and Qwen2 keep newlines together and glue a newline to the punctuation before it.
    assert synthetic_tokenizers["synthetic-qwen2"].words("end.\n\nNext") == ["end", ".\n\n", "Next"]


# --- the synthetic vocabulary writer --------------------------------------------------------------


@pytest.mark.parametrize("vocab_size", [512, 2048, 151936])
def test_synthetic_vocabulary_has_exactly_the_requested_size(vocab_size):
    tokens, token_types, merges = build_vocab(vocab_size)
    assert len(tokens) == len(token_types) == vocab_size
    assert len(set(tokens)) == vocab_size
    assert tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert all(left + right in tokens for left, right in merges[:50])


def test_synthetic_tokenizer_of_the_largest_size_builds(tmp_path):
    tokens, token_types, merges = build_vocab(151936)
    start = time.perf_counter()
    tokenizer = Tokenizer(
        source="synthetic",
        tokens=tokens,
        token_types=token_types,
        merges=merges,
        pre_tokenizer="qwen2",
        bos_id=IM_START,
        eos_id=IM_END,
        end_ids=(),
        add_bos=False,
    )
    assert time.perf_counter() - start < 5.0
    assert tokenizer.vocab_size == 151936
    assert tokenizer.decode(tokenizer.encode("hello world")) == "hello world"


def test_synthetic_gguf_is_byte_for_byte_reproducible(tmp_path):
    first = write_gguf(tmp_path / "a.gguf", lambda w: add_tokenizer_metadata(w, 4096, pre="llama-bpe"))
    second = write_gguf(tmp_path / "b.gguf", lambda w: add_tokenizer_metadata(w, 4096, pre="llama-bpe"))
    assert first.read_bytes() == second.read_bytes()


def test_padding_tokens_are_never_produced_and_decode_to_nothing(synthetic_tokenizers):
    tokenizer = synthetic_tokenizers["synthetic-llama-bpe"]
    _tokens, token_types, _merges = build_vocab(2048)
    first_padding = token_types.index(gguf.TokenType.UNUSED)
    texts = [CORPUS, "<|extra_0|> <|extra_5|>", *(case["text"] for case in SYNTHETIC["synthetic-llama-bpe"]["cases"])]
    for text in texts:
        assert max(tokenizer.encode(text), default=0) < first_padding
    assert tokenizer.token_text(first_padding) == "<|extra_0|>"
    assert tokenizer.decode([first_padding]) == ""


def test_synthetic_vocabulary_size_is_checked():
    writer = gguf.GGUFWriter(None, "llama")
    with pytest.raises(ValueError, match="vocab_size"):
        add_tokenizer_metadata(writer, 100)


# --- refusals -------------------------------------------------------------------------------------


def test_unknown_pre_tokenizer_is_refused(tmp_path):
    with pytest.raises(TokenizerError, match=r"custom\.gguf: tokenizer\.ggml\.pre 'mystery-bpe' is not supported"):
        custom_tokenizer(tmp_path, pre="mystery-bpe")


def test_unknown_tokenizer_model_is_refused(tmp_path):
    with pytest.raises(
        TokenizerError,
        match=r"custom\.gguf: tokenizer\.ggml\.model 'rwkv' is not supported "
        r"\(supported: gpt2 \(byte-level BPE\), llama \(SentencePiece\)\)",
    ):
        custom_tokenizer(tmp_path, model="rwkv")


def test_missing_vocabulary_is_refused(tmp_path):
    path = write_gguf(tmp_path / "empty.gguf", lambda w: w.add_tokenizer_model("gpt2"))
    with pytest.raises(TokenizerError, match=r"empty\.gguf: required tokenizer key 'tokenizer\.ggml\.tokens'"):
        Tokenizer.from_gguf(GGUFFile(path))


def test_bos_out_of_range_is_refused(tmp_path):
    def write_keys(writer: gguf.GGUFWriter) -> None:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(["a", "b"])
        writer.add_token_merges(["a b"])
        writer.add_bos_token_id(7)

    path = write_gguf(tmp_path / "bad-bos.gguf", write_keys)
    with pytest.raises(TokenizerError, match=r"bad-bos\.gguf: tokenizer\.ggml\.bos_token_id = 7 is outside"):
        Tokenizer.from_gguf(GGUFFile(path))


def test_merge_of_unknown_tokens_is_refused(tmp_path):
    def write_keys(writer: gguf.GGUFWriter) -> None:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_list(["a", "b"])
        writer.add_token_merges(["a c"])

    path = write_gguf(tmp_path / "bad-merge.gguf", write_keys)
    with pytest.raises(TokenizerError, match=r"bad-merge\.gguf: tokenizer\.ggml\.merges cannot be used"):
        Tokenizer.from_gguf(GGUFFile(path))
