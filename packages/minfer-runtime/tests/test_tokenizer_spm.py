"""SentencePiece vocabularies (`tokenizer.ggml.model = llama`): ids equal llama.cpp's, text survives the round trip.

The fixture (tools/make_spm_tokenizer_fixture.py, `nox -s tokenizer_spm_fixture`) holds llama.cpp's ids for a
model trained with the `sentencepiece` library and converted by llama.cpp's converter (its keys recorded, so
the file is written again here), for the real Gemma 3 270M vocabulary (when `minfer pull gemma3` has run), and
for minfer's synthetic SentencePiece vocabularies; sentencepiece and transformers cross-checked each.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import gguf
import pytest
from test_tokenizer import write_gguf

from minfer import cli
from minfer.errors import TokenizerError
from minfer.gguf_file import GGUFFile
from minfer.model_store import KNOWN_MODELS
from minfer.testing.synthetic import write_synthetic_model
from minfer.testing.vocab import CORPUS, SENTENCEPIECE_STYLES, add_sentencepiece_metadata, build_sentencepiece_vocab
from minfer.tokenizer import Tokenizer
from minfer.tokenizer_spm import SPACE_SYMBOL

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "tokenizer_spm_ids.json").read_text(encoding="utf-8"))
VOCABULARIES = FIXTURE["vocabularies"]
TRAINED = VOCABULARIES["sentencepiece-bpe"]
GEMMA = VOCABULARIES["gemma3-270m"]
SYNTHETIC = {name: entry for name, entry in VOCABULARIES.items() if name.startswith("synthetic-spm-")}


def write_recorded_keys(writer: gguf.GGUFWriter, keys: list[list]) -> None:
    """The converter's keys as the fixture records them: [key, value type, element type, value]."""
    for key, kind, element, value in keys:
        if key != "general.architecture":  # the writer's own
            sub_type = gguf.GGUFValueType[element] if element else None
            writer.add_key_value(key, value, gguf.GGUFValueType[kind], sub_type=sub_type)


def spm_tokenizer(
    tmp_path: Path, name: str = "spm", style: str = "llama2", vocab_size: int = 2048, **keys
) -> Tokenizer:
    """A synthetic SentencePiece vocabulary, with tokenizer keys replaced or added by `keys`
    (`tokenizer.ggml.` left out of their names; None removes a key)."""

    def write_keys(writer: gguf.GGUFWriter) -> None:
        add_sentencepiece_metadata(writer, vocab_size, style=style)
        for short, value in keys.items():
            key = f"tokenizer.ggml.{short}"
            writer.kv_data[0].pop(key, None)
            if value is not None:
                kind = gguf.GGUFValueType.BOOL if isinstance(value, bool) else gguf.GGUFValueType.UINT32
                writer.add_key_value(key, value, kind)

    return Tokenizer.from_gguf(GGUFFile(write_gguf(tmp_path / f"{name}.gguf", write_keys)))


@pytest.fixture(scope="module")
def trained_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """The sentencepiece-trained model's vocabulary, written again from the converter's recorded keys."""
    path = tmp_path_factory.mktemp("spm") / "sentencepiece-bpe.gguf"
    return Tokenizer.from_gguf(GGUFFile(write_gguf(path, lambda w: write_recorded_keys(w, TRAINED["keys"]))))


@pytest.fixture(scope="module")
def synthetic_spm_tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tokenizer]:
    folder = tmp_path_factory.mktemp("spm-synthetic")
    return {
        name: Tokenizer.from_gguf(
            GGUFFile(
                write_gguf(
                    folder / f"{name}.gguf",
                    lambda w, e=entry: add_sentencepiece_metadata(w, e["vocab_size"], style=e["style"]),
                    entry["architecture"],
                    entry["general_name"],
                )
            )
        )
        for name, entry in SYNTHETIC.items()
    }


@pytest.fixture(scope="module")
def gemma_gguf(gemma3_model_path: Path) -> GGUFFile:
    return GGUFFile(gemma3_model_path)


@pytest.fixture(scope="module")
def gemma_tokenizer(gemma_gguf: GGUFFile) -> Tokenizer:
    return Tokenizer.from_gguf(gemma_gguf)


@pytest.fixture(scope="module")
def all_tokenizers(trained_tokenizer, synthetic_spm_tokenizers) -> dict[str, Tokenizer]:
    """Every fixture vocabulary but Gemma's (whose file may be absent)."""
    return {"sentencepiece-bpe": trained_tokenizer, **synthetic_spm_tokenizers}


def spm_vocab_sha256(vocab_size: int, style: str) -> str:
    """The digest tools/make_spm_tokenizer_fixture.py records for a synthetic vocabulary."""
    tokens, scores, token_types = build_sentencepiece_vocab(vocab_size, style)
    content = json.dumps([tokens, scores, [int(t) for t in token_types]], ensure_ascii=False)
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def stream(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    decoder = tokenizer.stream_decoder()
    return [decoder.feed(token_id) for token_id in ids] + [decoder.flush()]


def check_ids(tokenizer: Tokenizer, entry: dict) -> None:
    for case in entry["cases"]:
        assert tokenizer.encode(case["text"], add_bos=False) == case["ids"], case["text"]
        no_special = case.get("ids_no_special", case["ids"])
        assert tokenizer.encode(case["text"], add_bos=False, parse_special=False) == no_special, case["text"]


def check_decoding(tokenizer: Tokenizer, entry: dict) -> None:
    for case in entry["cases"]:
        assert tokenizer.decode(case["ids"]) == case["decoded"], case["text"]
        assert "".join(stream(tokenizer, case["ids"])) == case["decoded"], case["text"]


# --- the fixture itself ---------------------------------------------------------------------------


def test_fixture_comes_from_llama_cpp_and_covers_enough():
    assert FIXTURE["reference"]["name"] == "llama.cpp" and FIXTURE["reference"]["version"]
    assert {package["name"] for package in FIXTURE["cross_checks"]["packages"]} == {"sentencepiece", "transformers"}
    assert set(VOCABULARIES) == {
        "sentencepiece-bpe",
        "gemma3-270m",
        *(f"synthetic-spm-{s}" for s in ("gemma", "llama2", "phi3")),
    }
    texts = [case["text"] for case in GEMMA["cases"]]
    assert len(set(texts)) >= 80
    assert any("<start_of_turn>" in text for text in texts) and any("<s>" in text for text in texts)
    assert any(ord(char) > 0x1F000 for text in texts for char in text)  # emoji
    assert any("\u4e00" <= char <= "\u9fff" for text in texts for char in text)  # CJK
    assert any("   " in text for text in texts) and any("\t\t" in text for text in texts)
    assert max(len(case["ids"]) for case in GEMMA["cases"]) > 512
    assert GEMMA["file_sha256"] == KNOWN_MODELS["gemma3"].sha256


def test_sentencepiece_itself_agrees_with_llama_cpp_on_the_trained_model():
    """The library the model was trained with is a second, independent reference for every text it can read."""
    disagreements = FIXTURE["cross_checks"]["disagreements"]
    assert not [item for item in disagreements if item["cross_check"] == "sentencepiece"]  # ids and decoding
    assert FIXTURE["cross_checks"]["texts_checked"]["sentencepiece-bpe"]["sentencepiece"] >= 70


def test_trained_vocabulary_is_the_converters():
    keys = {key: value for key, _kind, _element, value in TRAINED["keys"]}
    assert keys["tokenizer.ggml.model"] == "llama"
    types = keys["tokenizer.ggml.token_type"]
    assert types.count(gguf.TokenType.BYTE) == 256 and types.count(gguf.TokenType.USER_DEFINED) == 1
    assert [keys["tokenizer.ggml.tokens"][i] for i in range(3)] == ["<unk>", "<s>", "</s>"]
    assert "tokenizer.ggml.add_space_prefix" not in keys  # the converter writes none for Llama: it is on


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_vocabulary_is_the_one_the_fixture_was_made_from(name):
    entry = SYNTHETIC[name]
    assert spm_vocab_sha256(entry["vocab_size"], entry["style"]) == entry["vocab_sha256"], (
        "minfer.testing.vocab changed: regenerate the fixture with `nox -s tokenizer_spm_fixture`"
    )


# --- ids equal llama.cpp's ------------------------------------------------------------------------


def test_trained_model_ids_equal_llama_cpp(trained_tokenizer):
    check_ids(trained_tokenizer, TRAINED)


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_ids_equal_llama_cpp(synthetic_spm_tokenizers, name):
    check_ids(synthetic_spm_tokenizers[name], SYNTHETIC[name])


def test_gemma_ids_equal_llama_cpp(gemma_tokenizer):
    check_ids(gemma_tokenizer, GEMMA)


def test_gemma_known_ids(gemma_tokenizer):
    assert gemma_tokenizer.vocab_size == 262144
    assert (gemma_tokenizer.bos_id, gemma_tokenizer.eos_id) == (2, 1)
    assert gemma_tokenizer.add_bos and not gemma_tokenizer.add_eos and not gemma_tokenizer.add_space_prefix
    assert gemma_tokenizer.encode("Hello world!") == [2, 9259, 1902, 236888]
    # <eos>, <end_of_turn>, and </s>: an HTML tag in Gemma's vocabulary, but llama.cpp ends generation on it.
    assert gemma_tokenizer.stop_ids == frozenset({1, 106, 212})
    assert gemma_tokenizer.token_text(212) == "</s>"
    assert gemma_tokenizer.words("Hello world") == [f"Hello{SPACE_SYMBOL}world"]


def test_gemma_loads_and_encodes_fast(gemma_gguf):
    start = time.perf_counter()
    tokenizer = Tokenizer.from_gguf(gemma_gguf)
    built = time.perf_counter() - start
    text = CORPUS[:4096]
    start = time.perf_counter()
    ids = tokenizer.encode(text)
    encoded = time.perf_counter() - start
    assert built < 2.0  # about 0.3 s on a laptop; generous for a busy CI machine
    assert encoded < 0.5  # about 15 ms
    assert tokenizer.decode(ids) == "<bos>" + text


# --- decoding -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sentencepiece-bpe", *sorted(SYNTHETIC)])
def test_decoding_equals_llama_cpps(all_tokenizers, name):
    check_decoding(all_tokenizers[name], VOCABULARIES[name])


def test_gemma_decoding_equals_llama_cpps(gemma_tokenizer):
    check_decoding(gemma_tokenizer, GEMMA)


def test_gemma_round_trips_every_text(gemma_tokenizer):
    """No space prefix: every text comes back as it went in, special tokens as their text; but a `▁` typed in
    the text is read as the space it stands for, by llama.cpp too."""
    for case in GEMMA["cases"]:
        expected = case["text"].replace(SPACE_SYMBOL, " ")
        assert gemma_tokenizer.decode(gemma_tokenizer.encode(case["text"], add_bos=False)) == expected


def test_texts_without_special_tokens_round_trip_with_the_space_prefix(all_tokenizers):
    """With the space prefix, a special token is followed by a space that was not in the text (llama.cpp), so
    only texts without one come back unchanged; the prefix in front of the text is dropped again."""
    tokenizer = all_tokenizers["sentencepiece-bpe"]
    assert tokenizer.add_space_prefix
    plain = [
        case
        for case in TRAINED["cases"]
        if not set(case["ids"]) & tokenizer.special_ids and SPACE_SYMBOL not in case["text"]
    ]
    assert len(plain) >= 70
    for case in plain:
        assert tokenizer.decode(tokenizer.encode(case["text"], add_bos=False)) == case["text"]


def test_streamed_decoding_never_breaks_a_character(gemma_tokenizer):
    text = "🦙 日本語 👍🏽 𝕳𝖊𝖑𝖑𝖔 café"
    ids = gemma_tokenizer.encode(text, add_bos=False)
    pieces = stream(gemma_tokenizer, ids)
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)
    assert "" in pieces[:-1]  # 🦙 is four byte tokens in Gemma's vocabulary: some pieces wait for more


def test_byte_fallback_both_ways(synthetic_spm_tokenizers):
    tokenizer = synthetic_spm_tokenizers["synthetic-spm-llama2"]
    ids = tokenizer.encode("🦙", add_bos=False)
    assert [tokenizer.token_text(token_id) for token_id in ids] == ["▁", "<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"]
    assert tokenizer.decode(ids) == "🦙"
    assert [tokenizer.token_bytes(token_id) for token_id in ids] == [b" ", b"\xf0", b"\x9f", b"\xa6", b"\x99"]


def test_the_space_prefix_is_dropped_once_from_the_first_token_only(synthetic_spm_tokenizers):
    tokenizer = synthetic_spm_tokenizers["synthetic-spm-llama2"]
    bos, the = tokenizer.bos_id, tokenizer.encode("the", add_bos=False)
    assert [tokenizer.token_text(token_id) for token_id in the] == ["▁the"]
    assert tokenizer.decode(the + the) == "the the"
    assert tokenizer.decode([bos, *the]) == "<s> the"  # llama.cpp drops the space only from the first token
    assert "".join(stream(tokenizer, the + the)) == "the the"
    decoder = tokenizer.stream_decoder()
    assert [decoder.feed(the[0]), decoder.feed(the[0]), decoder.flush(), decoder.feed(the[0])] == [
        "the",
        " the",
        "",
        "the",  # a flush starts a new stream
    ]


def test_gemma_style_keeps_every_space(synthetic_spm_tokenizers):
    tokenizer = synthetic_spm_tokenizers["synthetic-spm-gemma"]
    assert not tokenizer.add_space_prefix
    assert tokenizer.decode(tokenizer.encode(" the", add_bos=False)) == " the"
    assert tokenizer.encode("the", add_bos=False) != tokenizer.encode(" the", add_bos=False)


# --- special tokens and flags ---------------------------------------------------------------------


def test_user_defined_tokens_are_matched_always_control_tokens_only_when_parsing(synthetic_spm_tokenizers):
    tokenizer = synthetic_spm_tokenizers["synthetic-spm-gemma"]
    turn, newline = tokenizer.encode("<start_of_turn>", add_bos=False), tokenizer.encode("\n", add_bos=False)
    assert [tokenizer.token_text(token_id) for token_id in turn + newline] == ["<start_of_turn>", "\n"]
    spelled = tokenizer.encode("<start_of_turn>\n", add_bos=False, parse_special=False)
    assert turn[0] not in spelled and spelled[-1] == newline[0]


def test_a_space_prefix_follows_every_special_token(synthetic_spm_tokenizers):
    """llama.cpp's rule (and SentencePiece's dummy prefix): each text fragment that starts the text or follows
    a special token gets the prefix."""
    tokenizer = synthetic_spm_tokenizers["synthetic-spm-llama2"]
    ids = tokenizer.encode("</s>the", add_bos=False)
    assert [tokenizer.token_text(token_id) for token_id in ids] == ["</s>", "▁the"]


def test_sentencepiece_defaults_follow_llama_cpp(tmp_path):
    """No BOS/EOS ids, flags or space-prefix key: llama.cpp's SentencePiece defaults (BOS 1, EOS 2, BOS added,
    EOS not, the space prefix on)."""
    tokenizer = spm_tokenizer(
        tmp_path, bos_token_id=None, eos_token_id=None, add_bos_token=None, add_eos_token=None, add_space_prefix=None
    )
    assert (tokenizer.bos_id, tokenizer.eos_id) == (1, 2)
    assert tokenizer.add_bos and not tokenizer.add_eos and tokenizer.add_space_prefix
    assert tokenizer.encode("the") == [1, *tokenizer.encode("the", add_bos=False)]


def test_eos_is_appended_when_the_file_asks(tmp_path):
    tokenizer = spm_tokenizer(tmp_path, add_eos_token=True)
    assert tokenizer.add_eos
    ids = tokenizer.encode("the")
    assert ids[0] == tokenizer.bos_id and ids[-1] == tokenizer.eos_id
    assert tokenizer.encode("the", add_eos=False)[-1] != tokenizer.eos_id


def test_the_space_prefix_can_be_turned_off(tmp_path):
    tokenizer = spm_tokenizer(tmp_path, add_space_prefix=False)
    assert not tokenizer.add_space_prefix
    assert [tokenizer.token_text(token_id) for token_id in tokenizer.encode("the", add_bos=False)] != ["▁the"]


def test_every_style_round_trips_the_corpus(tmp_path):
    for style in SENTENCEPIECE_STYLES:
        tokenizer = spm_tokenizer(tmp_path, name=style, style=style)
        assert tokenizer.decode(tokenizer.encode(CORPUS, add_bos=False)) == CORPUS


@pytest.mark.parametrize("style", sorted(SENTENCEPIECE_STYLES))
def test_synthetic_vocabulary_has_exactly_the_requested_size(style):
    tokens, scores, token_types = build_sentencepiece_vocab(1000, style)
    assert len(tokens) == len(scores) == len(token_types) == len(set(tokens)) == 1000
    assert token_types.count(gguf.TokenType.BYTE) == 256
    with pytest.raises(ValueError, match="vocab_size must be in"):
        build_sentencepiece_vocab(300, style)


# --- refusals -------------------------------------------------------------------------------------


def test_scores_of_the_wrong_length_are_refused(tmp_path):
    def write_keys(writer: gguf.GGUFWriter) -> None:
        add_sentencepiece_metadata(writer, 1000)
        writer.kv_data[0]["tokenizer.ggml.scores"].value.pop()

    path = write_gguf(tmp_path / "short-scores.gguf", write_keys)
    with pytest.raises(TokenizerError, match=r"short-scores\.gguf: tokenizer\.ggml\.scores has 999 entries for 1000"):
        Tokenizer.from_gguf(GGUFFile(path))


def test_a_nan_score_is_refused(tmp_path):
    def write_keys(writer: gguf.GGUFWriter) -> None:
        add_sentencepiece_metadata(writer, 1000)
        writer.kv_data[0]["tokenizer.ggml.scores"].value[700] = float("nan")

    path = write_gguf(tmp_path / "nan.gguf", write_keys)
    with pytest.raises(TokenizerError, match=r"nan\.gguf: tokenizer\.ggml\.scores\[700\] is NaN"):
        Tokenizer.from_gguf(GGUFFile(path))


def test_a_missing_byte_token_is_named_when_the_text_needs_it(tmp_path):
    def write_keys(writer: gguf.GGUFWriter) -> None:
        add_sentencepiece_metadata(writer, 1000)
        tokens = writer.kv_data[0]["tokenizer.ggml.tokens"].value
        tokens[tokens.index("<0xF0>")] = "<not-a-byte>"

    tokenizer = Tokenizer.from_gguf(GGUFFile(write_gguf(tmp_path / "no-f0.gguf", write_keys)))
    assert tokenizer.decode(tokenizer.encode("still fine", add_bos=False)) == "still fine"
    with pytest.raises(TokenizerError, match=r"no-f0\.gguf: the text needs byte 0xF0, .* \(<0xF0>\)"):
        tokenizer.encode("🦙")


# --- a whole model file ---------------------------------------------------------------------------


@pytest.mark.parametrize("style", sorted(SENTENCEPIECE_STYLES))
def test_minfer_info_describes_a_model_with_a_sentencepiece_vocabulary(tmp_path, capsys, style):
    """A synthetic llama model whose BPE vocabulary is swapped for a SentencePiece one of the same size."""
    model = GGUFFile(write_synthetic_model(tmp_path / "bpe.gguf", "tiny-llama", weight_type="F32"))
    path = tmp_path / f"spm-{style}.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    for key, kind in model.value_types.items():
        if not key.startswith(("tokenizer.", "general.architecture", "general.alignment")):
            sub_type = kind.element if kind.element is not None else None
            writer.add_key_value(key, model.metadata[key], kind.type, sub_type=sub_type)
    add_sentencepiece_metadata(writer, len(model.metadata["tokenizer.ggml.tokens"]), style=style)
    for name, tensor in model.tensors.items():
        writer.add_tensor(name, tensor.data, raw_dtype=tensor.qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert cli.main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "llama (pre default), 512 tokens" in out


def test_phi3s_special_tokens_swallow_the_whitespace_after_them(synthetic_spm_tokenizers):
    """llama.cpp's per-model attribute, by the file's general.name; `<s>` is the exception."""
    phi3, llama2 = synthetic_spm_tokenizers["synthetic-spm-phi3"], synthetic_spm_tokenizers["synthetic-spm-llama2"]
    text = "</s>  \n\tthe"
    assert [phi3.token_text(token_id) for token_id in phi3.encode(text, add_bos=False)] == ["</s>", "▁the"]
    assert len(llama2.encode(text, add_bos=False)) > 2
    assert phi3.encode("<s>  the", add_bos=False) == llama2.encode("<s>  the", add_bos=False)
