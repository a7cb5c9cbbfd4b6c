"""The tokenizer a GGUF file describes: text to token ids and back.

A GGUF carries its tokenizer as metadata (`tokenizer.ggml.*`): the vocabulary,
each token's type, the BPE merges and the name of a pre-tokenizer. This
module supports byte-level BPE (`tokenizer.ggml.model = gpt2`, the GPT-2 /
Llama 3 / Qwen2 / SmolLM family) and reproduces llama.cpp's encoding
(`src/llama-vocab.cpp`) step by step:

1. Special tokens are cut out of the text first, longest first, each kept
   whole as its id. User-defined tokens always are; control tokens only when
   `parse_special` is set (the default here, as for a rendered chat prompt).
2. Each remaining piece is split by the pre-tokenizer's regexes, applied in
   sequence; every match and every gap between matches becomes a word.
3. Each word's UTF-8 bytes are spelled with GPT-2's 256 byte symbols and
   merged by BPE, lowest merge rank first.
4. BOS is prepended when the vocabulary asks for it, unless it is already
   the first token.

Steps 2 and 3 run in the Rust `tokenizers` library; the regexes are
llama.cpp's, so word boundaries and merges come out the same.
"""

from __future__ import annotations

import codecs
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gguf
import tokenizers

from minfer.errors import TokenizerError
from minfer.gguf_file import GGUFFile, printable


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
    # llama.cpp's fallback for files that name no pre-tokenizer.
    "default": PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2_WORDS, r"\p{N}+", r"[0-9][0-9][0-9]")),
}

# Texts of tokens that end a turn. llama.cpp treats every one of these as a
# control token and stops generation on it, whatever the file's token types say.
# Besides EOS, the tokens llama.cpp's vocabulary treats as the end of generation (llama_vocab::is_eog):
# end of turn, and end of message (Llama 3.1's <|eom_id|>, which closes a tool call).
END_OF_GENERATION_KEYS = ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
END_OF_TURN_TEXTS = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<end_of_turn>", "<|end|>")

SUPPORTED_MODELS = ("gpt2",)


class Tokenizer:
    """Byte-level BPE tokenizer built from a GGUF file's metadata (see the module docstring).

    `source` names the file in error messages; `pre_tokenizer` is the
    `tokenizer.ggml.pre` name in use.
    """

    def __init__(
        self,
        *,
        source: str,
        tokens: list[str],
        token_types: list[int],
        merges: list[tuple[str, str]],
        pre_tokenizer: str,
        bos_id: int | None,
        eos_id: int | None,
        end_ids: Sequence[int | None],
        add_bos: bool | None,
    ) -> None:
        """Prefer `Tokenizer.from_gguf`. Arguments are the decoded `tokenizer.ggml.*` values."""
        spec = PRE_TOKENIZERS[pre_tokenizer]
        self.source = source
        self.pre_tokenizer = pre_tokenizer
        self._tokens = tokens
        self._token_types = _with_end_of_turn_as_control(tokens, token_types)
        self._bos_id = bos_id
        self._eos_id = eos_id
        self._add_bos = spec.add_bos_default if add_bos is None else add_bos
        if self._add_bos and bos_id is None:
            raise TokenizerError(f"{source}: tokenizer.ggml.add_bos_token is true but no BOS token is set")
        self._word_splitter = _word_splitter(spec.regexes)
        self._bpe = _build_bpe(source, tokens, merges, self._word_splitter, spec.ignore_merges)
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
        if model not in SUPPORTED_MODELS:
            kind = " (SentencePiece)" if model == "llama" else ""
            raise TokenizerError(
                f"{source}: tokenizer.ggml.model '{model}'{kind} is not supported "
                f"(supported: {', '.join(SUPPORTED_MODELS)})"
            )
        # llama.cpp uses its 'default' regexes when a BPE file names no pre-tokenizer.
        pre_tokenizer = gguf_file.metadata.get("tokenizer.ggml.pre", "default")
        if not isinstance(pre_tokenizer, str) or pre_tokenizer not in PRE_TOKENIZERS:
            raise TokenizerError(
                f"{source}: tokenizer.ggml.pre '{printable(str(pre_tokenizer))}' is not supported "
                f"(supported: {', '.join(PRE_TOKENIZERS)})"
            )
        tokens = _token_list(gguf_file)
        return cls(
            source=source,
            tokens=tokens,
            token_types=_token_types(gguf_file, len(tokens)),
            merges=_merges(gguf_file),
            pre_tokenizer=pre_tokenizer,
            bos_id=_optional_token_id(gguf_file, "tokenizer.ggml.bos_token_id", len(tokens)),
            eos_id=_optional_token_id(gguf_file, "tokenizer.ggml.eos_token_id", len(tokens)),
            end_ids=[_optional_token_id(gguf_file, key, len(tokens)) for key in END_OF_GENERATION_KEYS],
            add_bos=_optional_flag(gguf_file, "tokenizer.ggml.add_bos_token"),
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

        A special token is cut out of the text as its own spelling; any other token comes out of BPE as the
        bytes its byte symbols spell (`Ġthe` is 4 bytes, " the").
        """
        special = {text for text, _ in self._specials_when_parsing}
        return max(
            len(text.encode("utf-8")) if text in special else len(_byte_level_bytes(text)) for text in self._tokens
        )

    def fewest_tokens(self, text: str) -> int:
        """A lower bound on the tokens `text` encodes to, found without tokenizing it (a huge text is costly to)."""
        nbytes = len(text.encode("utf-8", errors="surrogatepass"))
        return -(-nbytes // self.max_token_bytes)

    def encode(self, text: str, *, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        """Token ids of `text`.

        `add_bos=None` follows the file's `add_bos_token`; BOS is never added
        twice when the text already starts with the BOS token. With
        `parse_special=False`, control tokens written in the text (such as
        `<|im_start|>`) are encoded as plain text; user-defined tokens are
        still matched whole, as llama.cpp does.
        """
        ids: list[int] = []
        for fragment in self._split_special_tokens(text, parse_special):
            if isinstance(fragment, int):
                ids.append(fragment)
            else:
                ids.extend(self._bpe.encode(fragment, add_special_tokens=False).ids)
        wants_bos = self._add_bos if add_bos is None else add_bos
        if wants_bos:
            if self._bos_id is None:
                raise TokenizerError(f"{self.source}: BOS was asked for but the vocabulary has no BOS token")
            if ids[:1] != [self._bos_id]:
                ids.insert(0, self._bos_id)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`; bytes that are not valid UTF-8 become U+FFFD."""
        return b"".join(self.token_bytes(token_id) for token_id in ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token `token_id` stands for (a control token's text; nothing for an unused token)."""
        self._check_id(token_id)
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._pieces[token_id] = _token_bytes(self._tokens[token_id], self._token_types[token_id])
        return piece

    def token_text(self, token_id: int) -> str:
        """The token as the vocabulary spells it: `<|im_end|>`, or `Ġthe` for the bytes of " the"."""
        self._check_id(token_id)
        return self._tokens[token_id]

    def words(self, text: str) -> list[str]:
        """The words the pre-tokenizer cuts plain `text` into (step 2), before any merge.

        BPE never merges across two words, so this shows where token
        boundaries must fall: `["IT", "'S"]` under `llama-bpe`.
        """
        return [word for word, _span in self._word_splitter.pre_tokenize_str(text)]

    def stream_decoder(self) -> StreamDecoder:
        """A decoder for tokens that arrive one at a time (see `StreamDecoder`)."""
        return StreamDecoder(self)

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
    equals `Tokenizer.decode` of the same tokens.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        """The text that token `token_id` completes (possibly empty)."""
        return self._utf8.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is still buffered, and a fresh start for the next stream."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text


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
    """The Rust tokenizer doing steps 2 and 3: split into words, spell in byte symbols, merge."""
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


def _token_bytes(text: str, token_type: int) -> bytes:
    """The bytes a token decodes to, as llama.cpp's `token_to_piece` with specials shown."""
    if token_type in (gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED, gguf.TokenType.UNKNOWN):
        return text.encode("utf-8")
    if token_type == gguf.TokenType.NORMAL:
        return _byte_level_bytes(text)
    if token_type == gguf.TokenType.BYTE and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text):
        return bytes([int(text[3:5], 16)])
    return b""  # UNUSED or an unknown type: llama.cpp renders nothing


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


def _optional_token_id(gguf_file: GGUFFile, key: str, n_tokens: int) -> int | None:
    if key not in gguf_file.metadata:
        return None
    token_id = _required(gguf_file, key, int)
    if not 0 <= token_id < n_tokens:
        raise TokenizerError(f"{gguf_file.path}: {key} = {token_id} is outside the vocabulary of {n_tokens} tokens")
    return token_id


def _optional_flag(gguf_file: GGUFFile, key: str) -> bool | None:
    if key not in gguf_file.metadata:
        return None
    return bool(_required(gguf_file, key, int))  # a bool is an int
