"""SentencePiece vocabularies (`tokenizer.ggml.model = llama`): how llama.cpp's `llm_tokenizer_spm` spells text.

Gemma, Llama 2, Mistral, TinyLlama and Phi-3 ship a SentencePiece vocabulary: every token has a score
(`tokenizer.ggml.scores`), a space is written `▁` (U+2581) inside tokens, and 256 byte tokens `<0x00>` ..
`<0xFF>` spell whatever the vocabulary has no token for. `Tokenizer` (tokenizer.py) cuts special tokens out of
the text first; each plain-text fragment left is then encoded here, as llama.cpp does
(`src/llama-vocab.cpp`, `llama_vocab::impl::tokenize` and `llm_tokenizer_spm_session`):

1. With `tokenizer.ggml.add_space_prefix` (true unless the file says otherwise; Gemma's converter writes
   false), a fragment that starts the text or follows a special token gets a space in front.
2. Every space becomes `▁`, and the fragment is cut into its characters.
3. Bigram merge: of all pairs of neighbouring symbols whose concatenation is a token, the pair whose token has
   the highest score is merged (the leftmost on a tie), again and again until no neighbours form a token.
   There is no pre-tokenizer: a merge may cross a `▁` wherever the vocabulary has such a token. This is the
   merge SentencePiece's BPE models encode with, not the Viterbi search of its Unigram models.
4. Byte fallback: a symbol that is not a token (a character the vocabulary lacks) is written as the byte
   tokens of its UTF-8 bytes.

Decoding reverses steps 2 and 4: `▁` is a space again and byte tokens are joined back into UTF-8. With the
space prefix on, llama.cpp's detokenizer drops one leading space of the first token (`Tokenizer.decode`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from minfer.errors import TokenizerError

SPACE_SYMBOL = "\u2581"  # "▁": how SentencePiece writes a space inside a token
BYTE_TOKEN = "<0x{:02X}>"  # the text of the byte token for one byte, as llama.cpp's byte_to_token looks it up


class SentencePieceModel:
    """Steps 1-4 of the module docstring over one vocabulary: `encode` a plain-text fragment, `normal_bytes`
    for the text of a normal token."""

    add_bos_default = True  # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise

    def __init__(self, *, source: str, tokens: Sequence[str], scores: Sequence[float], add_space_prefix: bool) -> None:
        """`tokens` and `scores` as the file lists them (one score per token)."""
        if len(scores) != len(tokens):
            raise TokenizerError(f"{source}: tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} tokens")
        for token_id, score in enumerate(scores):
            if math.isnan(score):
                raise TokenizerError(f"{source}: tokenizer.ggml.scores[{token_id}] is NaN (token {tokens[token_id]!r})")
        self.source = source
        self.add_space_prefix = add_space_prefix
        self._ids = {text: token_id for token_id, text in enumerate(tokens)}
        # The heap is a min-heap: it holds minus the score, so the best pair comes out first.
        self._negated_scores = [-float(score) for score in scores]
        self._byte_ids: dict[int, int] = {}

    def encode(self, fragment: str, *, starts_text: bool) -> list[int]:
        """Token ids of one plain-text fragment; `starts_text` when it is the first thing in the text or follows
        a special token (where step 1 puts the space prefix)."""
        return self._merge(self._spelled(fragment, starts_text))

    def words(self, text: str) -> list[str]:
        """No cut before the merges: the one word is the text as they see it (steps 1 and 2)."""
        return [self._spelled(text, starts_text=True)] if text else []

    def normal_bytes(self, text: str) -> bytes:
        """The bytes of a normal token: its text with `▁` back to a space."""
        return text.replace(SPACE_SYMBOL, " ").encode("utf-8")

    def _spelled(self, fragment: str, starts_text: bool) -> str:
        text = " " + fragment if self.add_space_prefix and starts_text else fragment
        return text.replace(" ", SPACE_SYMBOL)

    def _merge(self, text: str) -> list[int]:
        """Steps 3 and 4 over `text` (spaces already `▁`), as llm_tokenizer_spm_session::tokenize.

        Symbol `i` starts at character `i` and keeps that start: a merge grows the left symbol over the right
        one, whose length becomes 0. `following`/`preceding` link the symbols still alive. A queued pair whose
        lengths no longer add up to the length it was queued with is stale (one side has merged since) and is
        skipped, as llama.cpp does.
        """
        n = len(text)
        if n == 0:
            return []
        ids, negated_scores = self._ids, self._negated_scores
        length = [1] * n
        preceding = list(range(-1, n - 1))
        following = [*range(1, n), -1]
        queue: list[tuple[float, int, int, int]] = []
        for left in range(n - 1):
            token_id = ids.get(text[left : left + 2])
            if token_id is not None:
                queue.append((negated_scores[token_id], left, left + 1, 2))
        heapq.heapify(queue)
        while queue:
            _score, left, right, size = heapq.heappop(queue)
            left_length, right_length = length[left], length[right]
            if left_length == 0 or right_length == 0 or left_length + right_length != size:
                continue
            length[left], length[right] = size, 0
            after = following[right]
            following[left] = after
            if after >= 0:
                preceding[after] = left
                merged = length[after] + size
                token_id = ids.get(text[left : left + merged])
                if token_id is not None:
                    heapq.heappush(queue, (negated_scores[token_id], left, after, merged))
            before = preceding[left]
            if before >= 0:
                merged = length[before] + size
                token_id = ids.get(text[before : before + merged])
                if token_id is not None:
                    heapq.heappush(queue, (negated_scores[token_id], before, left, merged))
        output: list[int] = []
        symbol = 0
        while symbol >= 0:
            piece = text[symbol : symbol + length[symbol]]
            token_id = ids.get(piece)
            if token_id is not None:
                output.append(token_id)
            else:
                output.extend(self._byte_id(byte) for byte in piece.encode("utf-8"))
            symbol = following[symbol]
        return output

    def _byte_id(self, byte: int) -> int:
        """The token for one byte of a character the vocabulary lacks: `<0xNN>`, else (as llama.cpp) a token
        whose text is that byte alone."""
        token_id = self._byte_ids.get(byte)
        if token_id is None:
            token_id = self._ids.get(BYTE_TOKEN.format(byte))
            if token_id is None and byte < 0x80:
                token_id = self._ids.get(chr(byte))
            if token_id is None:
                raise TokenizerError(
                    f"{self.source}: the text needs byte 0x{byte:02X}, which the vocabulary has no token for "
                    f"({BYTE_TOKEN.format(byte)})"
                )
            self._byte_ids[byte] = token_id
        return token_id
