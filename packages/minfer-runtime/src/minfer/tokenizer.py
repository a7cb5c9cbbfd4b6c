"""The tokenizer a GGUF file describes: text to token ids and back.

A GGUF carries its tokenizer as metadata (`tokenizer.ggml.*`): the vocabulary,
each token's type, and how plain text is spelled in tokens. Two kinds are
supported, each reproducing llama.cpp's encoding (`src/llama-vocab.cpp`):

- byte-level BPE (`tokenizer.ggml.model = gpt2`: GPT-2, Llama 3, Qwen2,
  SmolLM), here: merges by rank after a pre-tokenizer;
- SentencePiece (`tokenizer.ggml.model = llama`: Gemma, Llama 2, Mistral,
  Phi-3), in `tokenizer_spm.py`: a bigram merge by score, `▁` for spaces,
  byte fallback.

Encoding runs in steps:

1. Special tokens are cut out of the text first, longest first, each kept
   whole as its id. User-defined tokens always are; control tokens only when
   `parse_special` is set (the default here, as for a rendered chat prompt).
2. Each remaining fragment is spelled in tokens by the vocabulary's kind. For
   byte-level BPE: the pre-tokenizer's regexes, applied in sequence, split it
   into words (every match and every gap between matches is one); each word's
   UTF-8 bytes are spelled with GPT-2's 256 byte symbols and merged by BPE,
   lowest merge rank first. This runs in the Rust `tokenizers` library with
   llama.cpp's regexes, so word boundaries and merges come out the same.
3. BOS is prepended when the vocabulary asks for it, unless it is already
   the first token; EOS is appended when the vocabulary asks for that.
"""

from __future__ import annotations

import codecs
import functools
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import gguf
import tokenizers

from minfer.errors import TokenizerError
from minfer.gguf_file import GGUFFile, printable
from minfer.tokenizer_spm import SentencePieceModel


def _gpt2_byte_symbols() -> dict[int, str]:
    """GPT-2's byte-to-symbol table: printable Latin-1 bytes stand for themselves,
    the other 68 bytes (controls, space, ...) get the code points from U+0100 on,
    so every byte has a visible symbol and BPE never sees raw whitespace."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols = {byte: chr(byte) for byte in printable}
    next_code_point = 256
    for byte in range(256):
        if byte not in symbols:
            symbols[byte] = chr(next_code_point)
            next_code_point += 1
    return symbols


BYTE_TO_CHAR: dict[int, str] = _gpt2_byte_symbols()
CHAR_TO_BYTE: dict[str, int] = {char: byte for byte, char in BYTE_TO_CHAR.items()}

# Turns a byte-level token's text into a Latin-1 string of its bytes in one C
# call. Latin-1 characters that are not byte symbols (a raw space, say) map to
# U+FFFD so that encoding to Latin-1 fails and the careful path handles them.
_BYTE_SYMBOLS_TO_LATIN1 = str.maketrans(
    {chr(code): "\ufffd" for code in range(256) if chr(code) not in CHAR_TO_BYTE}
    | {char: chr(byte) for char, byte in CHAR_TO_BYTE.items()}
)

# Pre-tokenizer regexes, copied from llama.cpp's `llm_tokenizer_bpe`. llama.cpp
# spells case-insensitive contractions as `'[sS]` because its regex engine has
# no `(?i:)`; we keep that spelling, which also keeps Unicode case folding out.
_GPT2_WORDS = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3_WORDS = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_WORDS = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# GPT-4o's (o200k: Phi-4-mini, Llama 4): a word is an optional non-letter, then capitals, then lower-case letters,
# or capitals and then lower case, each with an optional contraction; numbers in runs of up to three. llama.cpp
# spells "capital" as a letter that is not a-z and "lower case" as one that is not A-Z (its engine has no
# \p{Lu}/\p{Ll}); we keep its spelling, so that the ids are its ids.
_GPT4O_WORDS = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp prepares text for BPE under one `tokenizer.ggml.pre` name."""

    regexes: tuple[str, ...]
    # Emit a whole word as one token when the vocabulary has it, before merging.
    ignore_merges: bool = False
    # Whether BOS is added when the file has no `tokenizer.ggml.add_bos_token`.
    add_bos_default: bool = False


PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    # Digits one by one, then GPT-2's split (StarCoder's tokenizer).
    "smollm": PreTokenizer((r"\p{N}", _GPT2_WORDS)),
    "gpt-2": PreTokenizer((_GPT2_WORDS,)),
    "qwen2": PreTokenizer((_QWEN2_WORDS,)),
    "llama-bpe": PreTokenizer((_LLAMA3_WORDS,), ignore_merges=True, add_bos_default=True),
    # The names llama.cpp gives GPT-4o's split (LLAMA_VOCAB_PRE_TYPE_GPT4O).
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie"), PreTokenizer((_GPT4O_WORDS,))),
    # llama.cpp's fallback for files that name no pre-tokenizer.
    "default": PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2_WORDS, r"\p{N}+", r"[0-9][0-9][0-9]")),
}

# Texts of tokens that end a turn. llama.cpp treats every one of these as a
# control token and stops generation on it, whatever the file's token types say.
# Besides EOS, the tokens llama.cpp's vocabulary treats as the end of generation (llama_vocab::is_eog):
# end of turn, and end of message (Llama 3.1's <|eom_id|>, which closes a tool call).
END_OF_GENERATION_KEYS = ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
# `</s>` is Llama 2's EOS; llama.cpp forces it on every vocabulary, so Gemma 3's `</s>` (a user-defined HTML tag
# there) is a control token too: spelled out when special tokens are not parsed, and the end of a generation.
END_OF_TURN_TEXTS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|end|>",
    "</s>",
)

# `tokenizer.ggml.model` values: how plain text is spelled in tokens.
SUPPORTED_MODELS = {"gpt2": "byte-level BPE", "llama": "SentencePiece"}

# llama.cpp's ids for a SentencePiece vocabulary that names no BOS or EOS token (llama_vocab::impl::load).
SENTENCEPIECE_DEFAULT_IDS = {"tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}

# llama.cpp gives Phi-3's special tokens (a model whose general.name says phi-3 or phi3) the RSTRIP attribute:
# each swallows the whitespace after it in the text, as Phi-3's own tokenizer config has them, except these.
PHI3_NAMES = ("phi-3", "phi3")
PHI3_KEEPS_WHITESPACE = ("<unk>", "<s>", "<|endoftext|>")
_C_WHITESPACE = " \t\n\v\f\r"  # C's isspace, which llama.cpp strips with


class BytePairModel:
    """Step 2 for byte-level BPE (the module docstring): words by the pre-tokenizer's regexes, then BPE over
    GPT-2's byte symbols, in the Rust `tokenizers` library."""

    def __init__(self, *, source: str, tokens: list[str], merges: list[tuple[str, str]], pre_tokenizer: str) -> None:
        if pre_tokenizer not in PRE_TOKENIZERS:
            raise TokenizerError(
                f"{source}: tokenizer.ggml.pre '{printable(pre_tokenizer)}' is not supported "
                f"(supported: {', '.join(PRE_TOKENIZERS)})"
            )
        spec = PRE_TOKENIZERS[pre_tokenizer]
        self.add_bos_default = spec.add_bos_default
        self.add_space_prefix = False
        self._word_splitter = _word_splitter(spec.regexes)
        self._bpe = _build_bpe(source, tokens, merges, self._word_splitter, spec.ignore_merges)

    def encode(self, fragment: str, *, starts_text: bool) -> list[int]:
        """Token ids of one plain-text fragment (`starts_text` makes no difference to byte-level BPE)."""
        return self._bpe.encode(fragment, add_special_tokens=False).ids

    def normal_bytes(self, text: str) -> bytes:
        """The bytes of a normal token: its byte symbols read back (`Ġthe` is b" the")."""
        return _byte_level_bytes(text)

    def words(self, text: str) -> list[str]:
        """The words the pre-tokenizer cuts `text` into."""
        return [word for word, _span in self._word_splitter.pre_tokenize_str(text)]


class Tokenizer:
    """The tokenizer of a GGUF file (see the module docstring): byte-level BPE or SentencePiece.

    `source` names the file in error messages; `pre_tokenizer` is the
    `tokenizer.ggml.pre` name (a SentencePiece vocabulary has no pre-tokenizer:
    llama.cpp ignores the name, and so does this).
    """

    def __init__(
        self,
        *,
        source: str,
        tokens: list[str],
        token_types: list[int],
        bos_id: int | None,
        eos_id: int | None,
        end_ids: Sequence[int | None],
        add_bos: bool | None,
        add_eos: bool | None = None,
        model: str = "gpt2",
        merges: list[tuple[str, str]] | None = None,
        pre_tokenizer: str = "default",
        scores: Sequence[float] | None = None,
        add_space_prefix: bool | None = None,
        rstrip_ids: Collection[int] = (),
    ) -> None:
        """Prefer `Tokenizer.from_gguf`. Arguments are the decoded `tokenizer.ggml.*` values; `model` picks the
        kind: "gpt2" reads `merges` and `pre_tokenizer`, "llama" `scores` (all 0 when None, as in llama.cpp)
        and `add_space_prefix` (None: on, llama.cpp's default). A flag left None takes llama.cpp's default.
        `rstrip_ids` are special tokens that swallow the whitespace after them (`PHI3_NAMES`)."""
        self.source = source
        self.pre_tokenizer = pre_tokenizer
        self._tokens = tokens
        self._token_types = _with_end_of_turn_as_control(tokens, token_types)
        self._bos_id = bos_id
        self._eos_id = eos_id
        self._rstrip_ids = frozenset(rstrip_ids)
        self._segmenter: BytePairModel | SentencePieceModel
        if model == "gpt2":
            if merges is None:
                raise TokenizerError(f"{source}: a byte-level BPE vocabulary needs tokenizer.ggml.merges")
            self._segmenter = BytePairModel(source=source, tokens=tokens, merges=merges, pre_tokenizer=pre_tokenizer)
        elif model == "llama":
            self._segmenter = SentencePieceModel(
                source=source,
                tokens=tokens,
                scores=[0.0] * len(tokens) if scores is None else scores,
                add_space_prefix=True if add_space_prefix is None else add_space_prefix,
            )
        else:
            raise _unsupported_model(source, model)
        self._add_bos = self._segmenter.add_bos_default if add_bos is None else add_bos
        self._add_eos = bool(add_eos)
        if self._add_bos and bos_id is None:
            raise TokenizerError(f"{source}: tokenizer.ggml.add_bos_token is true but no BOS token is set")
        if self._add_eos and eos_id is None:
            raise TokenizerError(f"{source}: tokenizer.ggml.add_eos_token is true but no EOS token is set")
        # Each token's bytes, worked out on first use: decoding touches few tokens.
        self._pieces: list[bytes | None] = [None] * len(tokens)
        self._specials_when_parsing = _special_tokens(tokens, self._token_types)
        self._specials_always = tuple(
            (text, token_id)
            for text, token_id in self._specials_when_parsing
            if self._token_types[token_id] == gguf.TokenType.USER_DEFINED
        )
        present_end_of_turn = (token_id for token_id, text in enumerate(tokens) if text in END_OF_TURN_TEXTS)
        self._stop_ids = frozenset(
            token_id for token_id in (eos_id, *end_ids, *present_end_of_turn) if token_id is not None
        )

    @classmethod
    def from_gguf(cls, gguf_file: GGUFFile) -> Tokenizer:
        """The tokenizer described by `gguf_file`'s `tokenizer.ggml.*` metadata."""
        source = str(gguf_file.path)
        model = _required(gguf_file, "tokenizer.ggml.model", str)
        if model not in SUPPORTED_MODELS:  # before reading keys that only the supported kinds have
            raise _unsupported_model(source, model)
        # llama.cpp uses its 'default' regexes when a BPE file names no pre-tokenizer.
        pre_tokenizer = gguf_file.metadata.get("tokenizer.ggml.pre", "default")
        if not isinstance(pre_tokenizer, str):
            raise TokenizerError(f"{source}: tokenizer.ggml.pre should be a str, got {type(pre_tokenizer).__name__}")
        tokens = _token_list(gguf_file)
        n_tokens = len(tokens)
        token_types = _token_types(gguf_file, n_tokens)
        sentencepiece = model == "llama"
        default_ids = SENTENCEPIECE_DEFAULT_IDS if sentencepiece else {}
        name = gguf_file.metadata.get("general.name")
        return cls(
            source=source,
            tokens=tokens,
            token_types=token_types,
            bos_id=_optional_token_id(gguf_file, "tokenizer.ggml.bos_token_id", n_tokens, default_ids),
            eos_id=_optional_token_id(gguf_file, "tokenizer.ggml.eos_token_id", n_tokens, default_ids),
            end_ids=[_optional_token_id(gguf_file, key, n_tokens) for key in END_OF_GENERATION_KEYS],
            add_bos=_optional_flag(gguf_file, "tokenizer.ggml.add_bos_token"),
            add_eos=_optional_flag(gguf_file, "tokenizer.ggml.add_eos_token"),
            model=model,
            merges=None if sentencepiece else _merges(gguf_file),
            pre_tokenizer=pre_tokenizer,
            scores=_scores(gguf_file) if sentencepiece else None,
            add_space_prefix=_optional_flag(gguf_file, "tokenizer.ggml.add_space_prefix") if sentencepiece else None,
            rstrip_ids=_phi3_rstrip_ids(tokens, token_types) if _is_phi3(name) else (),
        )

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def bos_id(self) -> int | None:
        """The beginning-of-sequence token, or None when the file names none."""
        return self._bos_id

    @property
    def eos_id(self) -> int | None:
        """The end-of-sequence token, or None when the file names none."""
        return self._eos_id

    @property
    def add_bos(self) -> bool:
        """Whether `encode` prepends BOS by default (`tokenizer.ggml.add_bos_token`)."""
        return self._add_bos

    @property
    def add_eos(self) -> bool:
        """Whether `encode` appends EOS by default (`tokenizer.ggml.add_eos_token`)."""
        return self._add_eos

    @property
    def add_space_prefix(self) -> bool:
        """Whether text gets a space in front when encoded, and loses one when decoded (SentencePiece only:
        `tokenizer.ggml.add_space_prefix`)."""
        return self._segmenter.add_space_prefix

    @property
    def stop_ids(self) -> frozenset[int]:
        """Tokens that end generation: EOS, the file's EOT, and any end-of-turn token of the vocabulary."""
        return self._stop_ids

    @functools.cached_property
    def special_ids(self) -> frozenset[int]:
        """Control, user-defined and unknown tokens: those matched whole in text (`<|im_start|>`), never spelled
        out of smaller pieces."""
        return frozenset(token_id for _, token_id in self._specials_when_parsing)

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The most bytes of text one token can stand for (worked out on first use: it reads the whole vocabulary).

        A special token is cut out of the text as its own spelling; any other token comes out of the merges as
        the bytes its text spells (`Ġthe` and `▁the` are 4 bytes, " the").
        """
        special = {text for text, _ in self._specials_when_parsing}
        normal_bytes = self._segmenter.normal_bytes
        return max(len(text.encode("utf-8")) if text in special else len(normal_bytes(text)) for text in self._tokens)

    def fewest_tokens(self, text: str) -> int:
        """A lower bound on the tokens `text` encodes to, found without tokenizing it (a huge text is costly to)."""
        nbytes = len(text.encode("utf-8", errors="surrogatepass"))
        return -(-nbytes // self.max_token_bytes)

    def encode(
        self, text: str, *, add_bos: bool | None = None, add_eos: bool | None = None, parse_special: bool = True
    ) -> list[int]:
        """Token ids of `text`.

        `add_bos=None` follows the file's `add_bos_token`; BOS is never added
        twice when the text already starts with the BOS token. `add_eos=None`
        follows `add_eos_token`. With `parse_special=False`, control tokens
        written in the text (such as `<|im_start|>`) are encoded as plain
        text; user-defined tokens are still matched whole, as llama.cpp does.
        """
        ids: list[int] = []
        after_special = True  # the start of the text counts as following a special token (SentencePiece's prefix)
        for fragment in self._split_special_tokens(text, parse_special):
            if isinstance(fragment, int):
                ids.append(fragment)
                after_special = True
            else:
                ids.extend(self._segmenter.encode(fragment, starts_text=after_special))
                after_special = False
        if self._add_bos if add_bos is None else add_bos:
            if self._bos_id is None:
                raise TokenizerError(f"{self.source}: BOS was asked for but the vocabulary has no BOS token")
            if ids[:1] != [self._bos_id]:
                ids.insert(0, self._bos_id)
        if self._add_eos if add_eos is None else add_eos:
            if self._eos_id is None:
                raise TokenizerError(f"{self.source}: EOS was asked for but the vocabulary has no EOS token")
            ids.append(self._eos_id)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`; bytes that are not valid UTF-8 become U+FFFD.

        With the space prefix on (SentencePiece), one leading space of the first token is dropped, as
        llama.cpp's detokenizer does: encoding put it there.
        """
        pieces = [self.token_bytes(token_id) for token_id in ids]
        if pieces and self.add_space_prefix:
            pieces[0] = _without_leading_space(pieces[0])
        return b"".join(pieces).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token `token_id` stands for (a control token's text; nothing for an unused token)."""
        self._check_id(token_id)
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._pieces[token_id] = self._token_bytes(token_id)
        return piece

    def token_text(self, token_id: int) -> str:
        """The token as the vocabulary spells it: `<|im_end|>`, or `Ġthe` / `▁the` for the bytes of " the"."""
        self._check_id(token_id)
        return self._tokens[token_id]

    def words(self, text: str) -> list[str]:
        """The words plain `text` is cut into before any merge (step 2).

        No merge crosses two words, so this shows where token boundaries must fall: `["IT", "'S"]` under
        byte-level BPE's `llama-bpe`. SentencePiece has no such cut: its one word is the text as the merges
        see it, spaces written `▁` (and the space prefix in front, when the vocabulary adds one).
        """
        return self._segmenter.words(text)

    def stream_decoder(self) -> StreamDecoder:
        """A decoder for tokens that arrive one at a time (see `StreamDecoder`)."""
        return StreamDecoder(self)

    def _token_bytes(self, token_id: int) -> bytes:
        """The bytes a token decodes to, as llama.cpp's `token_to_piece` with specials shown."""
        text, token_type = self._tokens[token_id], self._token_types[token_id]
        if token_type in (gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED, gguf.TokenType.UNKNOWN):
            return text.encode("utf-8")
        if token_type == gguf.TokenType.NORMAL:
            return self._segmenter.normal_bytes(text)
        if token_type == gguf.TokenType.BYTE and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text):
            return bytes([int(text[3:5], 16)])
        return b""  # UNUSED or an unknown type: llama.cpp renders nothing

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < len(self._tokens):
            raise TokenizerError(
                f"{self.source}: token id {token_id} is out of range (vocabulary of {len(self._tokens)} tokens)"
            )

    def _split_special_tokens(self, text: str, parse_special: bool) -> list[str | int]:
        """`text` cut into plain-text fragments and special token ids, as llama.cpp's
        `tokenizer_st_partition`: each special token in turn, longest first, is
        cut out of every fragment that is still text."""
        fragments: list[str | int] = [text] if text else []
        specials = self._specials_when_parsing if parse_special else self._specials_always
        for special_text, special_id in specials:
            if special_text not in text:
                continue
            cut: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, int) or special_text not in fragment:
                    cut.append(fragment)
                    continue
                for index, part in enumerate(fragment.split(special_text)):
                    if index > 0:
                        cut.append(special_id)
                        if special_id in self._rstrip_ids:
                            part = part.lstrip(_C_WHITESPACE)
                    if part:
                        cut.append(part)
            fragments = cut
        return fragments


class StreamDecoder:
    """Turns tokens into text as they arrive, never splitting a UTF-8 character.

    A character can span several tokens (an emoji is often four byte tokens).
    `feed` returns only complete characters and keeps an unfinished byte
    sequence until the tokens that finish it arrive; `flush` returns whatever
    is left, with U+FFFD for an unfinished sequence. The concatenated output
    equals `Tokenizer.decode` of the same tokens (the first token fed after
    the start or a flush loses a leading space where `decode`'s first does).
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = True

    def feed(self, token_id: int) -> str:
        """The text that token `token_id` completes (possibly empty)."""
        piece = self._tokenizer.token_bytes(token_id)
        if self._first:
            self._first = False
            if self._tokenizer.add_space_prefix:
                piece = _without_leading_space(piece)
        return self._utf8.decode(piece)

    def flush(self) -> str:
        """Whatever is still buffered, and a fresh start for the next stream."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        self._first = True
        return text


def _unsupported_model(source: str, model: str) -> TokenizerError:
    supported = ", ".join(f"{name} ({kind})" for name, kind in SUPPORTED_MODELS.items())
    return TokenizerError(
        f"{source}: tokenizer.ggml.model '{printable(model)}' is not supported (supported: {supported})"
    )


def _without_leading_space(piece: bytes) -> bytes:
    return piece[1:] if piece.startswith(b" ") else piece


def _word_splitter(regexes: tuple[str, ...]) -> tokenizers.pre_tokenizers.PreTokenizer:
    """Step 2: each regex in turn splits every piece into its matches and the gaps between them."""
    return tokenizers.pre_tokenizers.Sequence(
        [tokenizers.pre_tokenizers.Split(tokenizers.Regex(regex), behavior="isolated") for regex in regexes]
    )


def _build_bpe(
    source: str,
    tokens: list[str],
    merges: list[tuple[str, str]],
    word_splitter: tokenizers.pre_tokenizers.PreTokenizer,
    ignore_merges: bool,
) -> tokenizers.Tokenizer:
    """The Rust tokenizer doing step 2 for byte-level BPE: split into words, spell in byte symbols, merge."""
    vocab = {text: token_id for token_id, text in enumerate(tokens)}
    try:
        model = tokenizers.models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges)
    except Exception as exc:  # the binding reports a bad merge as a bare Exception
        raise TokenizerError(f"{source}: tokenizer.ggml.merges cannot be used ({exc})") from None
    bpe = tokenizers.Tokenizer(model)
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
        [
            word_splitter,
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
        ]
    )
    return bpe


def _with_end_of_turn_as_control(tokens: list[str], token_types: list[int]) -> list[int]:
    """Token types, with end-of-turn tokens forced to CONTROL as llama.cpp does."""
    return [
        gguf.TokenType.CONTROL if text in END_OF_TURN_TEXTS else token_type
        for text, token_type in zip(tokens, token_types, strict=True)
    ]


def _special_tokens(tokens: list[str], token_types: list[int]) -> tuple[tuple[str, int], ...]:
    """(text, id) of every token matched whole in text: control, user-defined and
    unknown tokens, longest (in UTF-8 bytes) first, then by id."""
    special_types = {gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED, gguf.TokenType.UNKNOWN}
    specials = [(text, token_id) for token_id, text in enumerate(tokens) if token_types[token_id] in special_types]
    specials.sort(key=lambda special: (-len(special[0].encode("utf-8")), special[1]))
    return tuple(specials)


def _is_phi3(name: object) -> bool:
    return isinstance(name, str) and any(part in name.lower() for part in PHI3_NAMES)


def _phi3_rstrip_ids(tokens: list[str], token_types: list[int]) -> list[int]:
    """Phi-3's tokens that swallow the whitespace after them: every special token and `</s>`, but
    `PHI3_KEEPS_WHITESPACE` (llama.cpp's per-model token attributes)."""
    special = {gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED, gguf.TokenType.UNKNOWN}
    types = _with_end_of_turn_as_control(tokens, token_types)
    return [
        token_id
        for token_id, text in enumerate(tokens)
        if (types[token_id] in special or text == "</s>") and text not in PHI3_KEEPS_WHITESPACE
    ]


def _byte_level_bytes(text: str) -> bytes:
    """Bytes of a token spelled in GPT-2 byte symbols; a character outside that
    alphabet (rare, and a converter bug) stands for its own UTF-8 bytes."""
    try:
        return text.translate(_BYTE_SYMBOLS_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:
        return b"".join(bytes([CHAR_TO_BYTE[char]]) if char in CHAR_TO_BYTE else char.encode("utf-8") for char in text)


def _required(gguf_file: GGUFFile, key: str, kind: type) -> Any:
    if key not in gguf_file.metadata:
        raise TokenizerError(f"{gguf_file.path}: required tokenizer key '{key}' is missing")
    value = gguf_file.metadata[key]
    if not isinstance(value, kind):
        raise TokenizerError(f"{gguf_file.path}: {key} should be a {kind.__name__}, got {type(value).__name__}")
    return value


def _token_list(gguf_file: GGUFFile) -> list[str]:
    tokens = _required(gguf_file, "tokenizer.ggml.tokens", list)
    if not tokens or not all(isinstance(token, str) for token in tokens):
        raise TokenizerError(f"{gguf_file.path}: tokenizer.ggml.tokens should be a non-empty list of strings")
    # llama.cpp renames empty tokens so that every token has a distinct text.
    tokens = [token or f"[EMPTY_{token_id}]" for token_id, token in enumerate(tokens)]
    if len(set(tokens)) != len(tokens):
        seen: dict[str, int] = {}
        for token_id, token in enumerate(tokens):
            if token in seen:
                raise TokenizerError(
                    f"{gguf_file.path}: tokenizer.ggml.tokens has '{token}' twice (ids {seen[token]} and {token_id})"
                )
            seen[token] = token_id
    return tokens


def _token_types(gguf_file: GGUFFile, n_tokens: int) -> list[int]:
    key = "tokenizer.ggml.token_type"
    if key not in gguf_file.metadata:
        return [gguf.TokenType.NORMAL] * n_tokens
    token_types = _required(gguf_file, key, list)
    if len(token_types) != n_tokens:
        raise TokenizerError(f"{gguf_file.path}: {key} has {len(token_types)} entries for {n_tokens} tokens")
    return [int(token_type) for token_type in token_types]


def _merges(gguf_file: GGUFFile) -> list[tuple[str, str]]:
    key = "tokenizer.ggml.merges"
    merges = _required(gguf_file, key, list)
    pairs = []
    for rank, merge in enumerate(merges):
        # Split at the first space after the first character, as llama.cpp does.
        split_at = merge.find(" ", 1) if isinstance(merge, str) else -1
        if split_at < 0:
            raise TokenizerError(f"{gguf_file.path}: {key}[{rank}] is not two tokens separated by a space: {merge!r}")
        pairs.append((merge[:split_at], merge[split_at + 1 :]))
    return pairs


def _scores(gguf_file: GGUFFile) -> list[float] | None:
    """`tokenizer.ggml.scores`, or None where the file has none (llama.cpp scores every token 0 then); the
    count is SentencePieceModel's to check."""
    key = "tokenizer.ggml.scores"
    if key not in gguf_file.metadata:
        return None
    scores = _required(gguf_file, key, list)
    if not all(isinstance(score, int | float) for score in scores):
        raise TokenizerError(f"{gguf_file.path}: {key} should be a list of numbers")
    return scores


def _optional_token_id(
    gguf_file: GGUFFile, key: str, n_tokens: int, defaults: dict[str, int] | None = None
) -> int | None:
    """The token id under `key`; where the file has none, the default llama.cpp gives that key (if it is in the
    vocabulary), else None."""
    if key not in gguf_file.metadata:
        default = (defaults or {}).get(key)
        return default if default is not None and default < n_tokens else None
    token_id = _required(gguf_file, key, int)
    if not 0 <= token_id < n_tokens:
        raise TokenizerError(f"{gguf_file.path}: {key} = {token_id} is outside the vocabulary of {n_tokens} tokens")
    return token_id


def _optional_flag(gguf_file: GGUFFile, key: str) -> bool | None:
    if key not in gguf_file.metadata:
        return None
    return bool(_required(gguf_file, key, int))  # a bool is an int
