"""Realistic tokenizers for synthetic GGUF files: byte-level BPE and SentencePiece.

`add_tokenizer_metadata` writes the `tokenizer.*` keys of a GGUF the way
llama.cpp's converter does for a GPT-2-style vocabulary: ChatML control
tokens, the 256 byte-level symbols, merges learned from a small embedded
English + code corpus, and unused padding tokens up to the requested size.

`add_sentencepiece_metadata` writes a SentencePiece vocabulary (`tokenizer.ggml.model
= llama`) the way the converter's `_set_vocab_sentencepiece` does: scores, token
types, the 256 byte tokens `<0x00>`..`<0xFF>`, control tokens, and the flags of one
family (`SENTENCEPIECE_STYLES`: Gemma's or Llama 2's). Its pieces are learned from
the same corpus with spaces written `▁`, as SentencePiece's BPE trainer would.

The merges are learned by a tiny pure-Python BPE trainer whose every tie is
broken by a fixed rule, so the same call writes the same bytes on every run
and every platform (the tokenizer fixtures record a hash of each vocabulary).
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from functools import cache

import gguf

from minfer.chat_template import CHATML
from minfer.tokenizer import BYTE_TO_CHAR
from minfer.tokenizer_spm import BYTE_TOKEN, SPACE_SYMBOL

# The three ChatML control tokens, at ids 0, 1, 2 as in SmolLM2's vocabulary.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BOS_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
MIN_VOCAB_SIZE = 512
MAX_VOCAB_SIZE = 262144  # the largest preset vocabulary: Gemma 3's

# The corpus the merges are learned from: prose, numbers and a few languages'
# worth of code, so common words, indentation runs and operators get tokens.
CORPUS = r'''
The quick brown fox jumps over the lazy dog. A large language model reads a prompt as a list of
tokens, computes a probability for every token of its vocabulary, and picks the next one. Then it
does it again, one token at a time, until it writes an end-of-turn token or reaches the limit.
Inference on a GPU is mostly about moving weights: at batch size one, every generated token reads
every weight once, so the time per token is the size of the model divided by the memory bandwidth.
The tokenizer turns text into numbers and numbers back into text. Byte-level BPE starts from the
256 possible bytes and learns merges: the most frequent pair of neighbouring symbols becomes a new
symbol, again and again, until the vocabulary is full. Words like "the", "and", "token" and "model"
end up as single tokens, while rare words are spelled out from smaller pieces.
It's a small model, but it's fast. We're testing it; they've seen it work, and I'll check it again.
You'd think it's simple, but there are many details: spaces, newlines, digits and special tokens.
In 2024 the model had 135 million parameters, 30 layers, 9 heads and a context of 8192 tokens.
Prices: $3.50, $12.99 and 1,000,000 units; ratios 3:2 and 16:9; dates 2025-01-31 and 12/05/2023.
Version 1.2.3 was released on March 4th; version 10.0 followed. Call +1 555 0100 for help.

Questions? Answers! Lists: first, second, third. Quotes "like this" and 'like that'.
Email me at someone@example.com or visit https://example.com/docs/index.html for more.

Le modèle répond en français: « Bonjour, ça va? » Déjà vu, café, crème brûlée, naïve façade.
Der schnelle braune Fuchs springt über den faulen Hund. Grüße aus München, Straße, schön.
El niño comió una manzana. ¿Dónde está la biblioteca? ¡Qué día tan bonito!
日本語の文章も少しだけ含めます。東京は日本の首都です。中文也有一点：你好，世界。
Русский текст: привет, мир. Ελληνικά: γεια σου κόσμε.

def softmax(logits: list[float]) -> list[float]:
    """Return the probabilities of a list of logits."""
    largest = max(logits)
    exps = [math.exp(x - largest) for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


class Tokenizer:
    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]]) -> None:
        self.vocab = vocab
        self.merges = {pair: rank for rank, pair in enumerate(merges)}

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in self.split(text):
            ids.extend(self.vocab[piece] for piece in self.bpe(word))
        return ids


for i in range(10):
    if i % 2 == 0:
        print(f"even {i}")
    elif i == 7:
        break
    else:
        continue

import numpy as np

x = np.zeros((4, 4), dtype=np.float32)
y = x @ x.T + 1.0
assert y.shape == (4, 4), "shape mismatch"

#include <stdio.h>
#include <stdlib.h>

static int add(int a, int b) {
    return a + b;
}

int main(int argc, char **argv) {
    for (int i = 0; i < argc; ++i) {
        printf("%d: %s\n", i, argv[i]);
    }
    return add(1, 2) == 3 ? 0 : 1;
}

__global__ void silu_f32(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = x[i] / (1.0f + expf(-x[i]));
    }
}

{"name": "minfer", "version": "0.1.0", "tokens": [1, 2, 3], "ok": true, "value": null}

$ pip install --no-deps minfer-runtime
$ minfer run "Why is the sky blue?" --max-tokens 64 --temp 0.7 --seed 42

# Heading

- a bullet point with `inline code` and **bold** text
- another point: see [the docs](docs/README.md)

| column | value |
|--------|-------|
| alpha  | 0.5   |
| beta   | 0.25  |

SELECT name, count(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY count(*) DESC;

fn main() {
    let numbers = vec![1, 2, 3];
    let total: i32 = numbers.iter().sum();
    println!("total = {}", total);
}

package main

import "fmt"

func main() {
    values := []int{4, 8, 15, 16, 23, 42}
    for index, value := range values {
        fmt.Printf("%d -> %d\n", index, value)
    }
}

public class Counter {
    private int count = 0;

    public synchronized void increment() {
        count++;
    }

    public int getCount() {
        return count;
    }
}

<!DOCTYPE html>
<html lang="en">
  <head><title>Chat</title></head>
  <body>
    <div class="message user">Hello there!</div>
    <div class="message assistant">Hi! What would you like to know?</div>
  </body>
</html>

model:
  name: smollm2-135m
  context_length: 8192
  layers: 30
  heads: 9
  kv_heads: 3

A cache keeps what was computed so that it need not be computed again. During decoding, the
attention layers keep the keys and values of every earlier position in the KV cache, so each new
token only computes its own row. The cache grows with the conversation; when it is full, the
engine must stop, or drop old positions, or start over. Sampling picks the next token from the
probabilities: greedy decoding always takes the most likely one, while temperature, top-k, top-p
and min-p trade accuracy for variety. A fixed seed makes every run repeat the same choices.
Good tests compare the engine against a reference that someone else wrote, on inputs that are
not all zeros, and they check the exact token ids, not only that something was produced.
The weather today is sunny with a light breeze from the west; tomorrow there may be rain.
She opened the window, looked at the garden and smiled: the roses were finally in bloom.
Once upon a time, in a small village by the sea, there lived an old fisherman and his cat.
Every morning they walked to the harbour together, and every evening they came home with fish.

function greet(name) {
    return `Hello, ${name}!`;
}
const result = [1, 2, 3].map((n) => n * 2).filter((n) => n > 2);
console.log(result);
'''

# Words for learning merges: a stdlib approximation of GPT-2's split (letters,
# digits, punctuation runs, whitespace), good enough to shape the merges.
_WORD_PATTERN = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")


def add_tokenizer_metadata(
    writer: gguf.GGUFWriter,
    vocab_size: int,
    *,
    pre: str = "smollm",
    chat_template: str | None = CHATML,
    add_bos: bool = False,
) -> None:
    """Write a complete byte-level BPE tokenizer of exactly `vocab_size` tokens into `writer`.

    Token ids: 0..2 the ChatML control tokens, then the 256 byte symbols, then
    the tokens the learned merges make, then `<|extra_N|>` padding marked UNUSED
    (no merge produces them and llama.cpp never matches UNUSED tokens in text).
    BOS is `<|im_start|>` and EOS `<|im_end|>`, as in SmolLM2.
    """
    if not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be in [{MIN_VOCAB_SIZE}, {MAX_VOCAB_SIZE}], got {vocab_size}")
    tokens, token_types, merges = build_vocab(vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges([f"{left} {right}" for left, right in merges])
    writer.add_bos_token_id(tokens.index(BOS_TOKEN))
    writer.add_eos_token_id(tokens.index(EOS_TOKEN))
    writer.add_add_bos_token(add_bos)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def build_vocab(vocab_size: int) -> tuple[list[str], list[gguf.TokenType], list[tuple[str, str]]]:
    """The tokens (exactly `vocab_size`), their types, and the merges in rank order."""
    tokens = [*SPECIAL_TOKENS, *(BYTE_TO_CHAR[b] for b in range(256))]
    known = set(tokens)
    merges: list[tuple[str, str]] = []
    for left, right in learned_merges():
        if len(tokens) == vocab_size:
            break
        merges.append((left, right))
        if left + right not in known:
            known.add(left + right)
            tokens.append(left + right)
    n_padding = vocab_size - len(tokens)
    token_types = (
        [gguf.TokenType.CONTROL] * len(SPECIAL_TOKENS)
        + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIAL_TOKENS))
        + [gguf.TokenType.UNUSED] * n_padding
    )
    tokens.extend(f"<|extra_{i}|>" for i in range(n_padding))
    return tokens, token_types, merges


@cache
def learned_merges() -> tuple[tuple[str, str], ...]:
    """BPE merges learned from `CORPUS`, most frequent first, until every word is one token."""
    word_counts = Counter(
        tuple(BYTE_TO_CHAR[b] for b in word.encode("utf-8")) for word in _WORD_PATTERN.findall(CORPUS)
    )
    return tuple(_train_bpe(word_counts))


@dataclass(frozen=True)
class SentencePieceStyle:
    """The special tokens and flags one family's converted files carry around a SentencePiece vocabulary."""

    # (text, type) of the tokens before the byte tokens, in id order.
    specials: tuple[tuple[str, gguf.TokenType], ...]
    # (text, type) of the tokens a fine-tune added after SentencePiece's own (its tokenizer config's).
    added: tuple[tuple[str, gguf.TokenType], ...]
    # Whether runs of spaces (`▁▁`, `▁▁▁▁`) are learned as normal tokens; Gemma has user-defined ones instead.
    learns_space_runs: bool
    special_score: float  # what the converter scores them
    bos: str
    eos: str
    unknown: str
    padding: str | None
    # The value of tokenizer.ggml.add_space_prefix, or None where the converter writes no key (llama.cpp's
    # default for SentencePiece is then true).
    add_space_prefix: bool | None
    # How the tokens past the learned ones are named ({id}: the token id, {n}: a count from `filler_first`)
    # and typed.
    filler: str
    filler_first: int
    filler_type: gguf.TokenType


_CONTROL, _USER_DEFINED = gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED

# Llama 2 / TinyLlama: <unk> <s> </s> scored 0 as SentencePiece stores them, no key for the space prefix (so it
# is on), and the converter's [PADn] fill.
LLAMA2_STYLE = SentencePieceStyle(
    specials=(("<unk>", gguf.TokenType.UNKNOWN), ("<s>", _CONTROL), ("</s>", _CONTROL)),
    added=(),
    learns_space_runs=True,
    special_score=0.0,
    bos="<s>",
    eos="</s>",
    unknown="<unk>",
    padding=None,
    add_space_prefix=None,
    filler="[PAD{id}]",
    filler_first=0,
    filler_type=gguf.TokenType.UNUSED,
)

# The chat tokens Phi-3-mini's config adds after Llama 2's vocabulary, in id order.
PHI3_ADDED = ["<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>", "<|placeholder3|>",
              "<|placeholder4|>", "<|system|>", "<|end|>", "<|placeholder5|>", "<|placeholder6|>",
              "<|user|>"]  # fmt: skip

SENTENCEPIECE_STYLES = {
    # Gemma 3, as llama.cpp converts it (conversion/gemma.py): every special token is CONTROL, <unk> too (the
    # tokenizer config marks it special); runs of newlines, spaces and tabs and a few HTML tags are
    # USER_DEFINED (matched whole in any text, spaces written as spaces); no space prefix; <unusedN> fill.
    "gemma": SentencePieceStyle(
        specials=(
            ("<pad>", _CONTROL),
            ("<eos>", _CONTROL),
            ("<bos>", _CONTROL),
            ("<unk>", _CONTROL),
            ("<mask>", _CONTROL),
            ("[multimodal]", _USER_DEFINED),
            *((f"<unused{i}>", _CONTROL) for i in range(4)),
            ("<start_of_turn>", _CONTROL),
            ("<end_of_turn>", _CONTROL),
            *(("\n" * n, _USER_DEFINED) for n in range(1, 9)),
            *((" " * n, _USER_DEFINED) for n in range(2, 9)),
            *(("\t" * n, _USER_DEFINED) for n in range(1, 5)),
            *((tag, _USER_DEFINED) for tag in ("<table>", "<tr>", "<td>", "</td>", "</tr>", "</table>", "<b>", "</b>")),
        ),
        added=(),
        learns_space_runs=False,
        special_score=-1000.0,
        bos="<bos>",
        eos="<eos>",
        unknown="<unk>",
        padding="<pad>",
        add_space_prefix=False,
        filler="<unused{n}>",
        filler_first=4,
        filler_type=_CONTROL,
    ),
    "llama2": LLAMA2_STYLE,
    # Phi-3-mini: Llama 2's vocabulary and the chat tokens its config adds after it, all CONTROL; EOS is
    # <|endoftext|>, and <|end|> ends a turn.
    "phi3": replace(LLAMA2_STYLE, added=tuple((text, _CONTROL) for text in PHI3_ADDED), eos="<|endoftext|>"),
}

# SentencePiece's pre-split for training (spaces already `▁`): letter runs, single digits, punctuation runs,
# each with the space in front of it, and runs of spaces. Newlines and tabs are left to byte fallback (or to
# a style's user-defined tokens).
_PIECE_PATTERN = re.compile(r"▁?[^\W\d_]+|▁?\d|▁?(?:[^\s\w▁]|_)+|▁+")


def add_sentencepiece_metadata(
    writer: gguf.GGUFWriter, vocab_size: int, *, style: str = "gemma", chat_template: str | None = None
) -> None:
    """Write a complete SentencePiece tokenizer of exactly `vocab_size` tokens into `writer`, the keys as
    llama.cpp's converter writes them for the family `style` names (a key of `SENTENCEPIECE_STYLES`).

    Token ids: the style's special tokens, the 256 byte tokens, the pieces the learned merges make (scored 0,
    -1, -2, ... in merge order, as SentencePiece scores them), the corpus's single characters (scored below
    every merge: they are never a merge's result), the style's added tokens, then its filler up to
    `vocab_size`.
    """
    tokens, scores, token_types = build_sentencepiece_vocab(vocab_size, style)
    spec = SENTENCEPIECE_STYLES[style]
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(token_types)
    writer.add_bos_token_id(tokens.index(spec.bos))
    writer.add_eos_token_id(tokens.index(spec.eos))
    writer.add_unk_token_id(tokens.index(spec.unknown))
    if spec.padding is not None:
        writer.add_pad_token_id(tokens.index(spec.padding))
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if spec.add_space_prefix is not None:
        writer.add_add_space_prefix(spec.add_space_prefix)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def build_sentencepiece_vocab(vocab_size: int, style: str) -> tuple[list[str], list[float], list[gguf.TokenType]]:
    """The tokens (exactly `vocab_size`), their scores and their types, for `add_sentencepiece_metadata`."""
    if style not in SENTENCEPIECE_STYLES:
        raise ValueError(f"unknown SentencePiece style {style!r} (choose from {', '.join(SENTENCEPIECE_STYLES)})")
    spec = SENTENCEPIECE_STYLES[style]
    characters = sentencepiece_characters()
    fixed = len(spec.specials) + 256 + len(characters) + len(spec.added)
    if not fixed <= vocab_size <= MAX_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be in [{fixed}, {MAX_VOCAB_SIZE}] for style {style!r}, got {vocab_size}")
    tokens = [text for text, _ in spec.specials]
    token_types = [token_type for _, token_type in spec.specials]
    scores = [spec.special_score] * len(tokens)
    tokens += [BYTE_TOKEN.format(byte) for byte in range(256)]
    token_types += [gguf.TokenType.BYTE] * 256
    scores += [0.0] * 256
    known = set(tokens)
    pieces: list[str] = []
    for left, right in learned_pieces():
        if len(pieces) == vocab_size - fixed:
            break
        if not spec.learns_space_runs and not (left + right).strip(SPACE_SYMBOL):
            continue
        if left + right not in known:
            known.add(left + right)
            pieces.append(left + right)
    pieces += characters
    tokens += pieces
    token_types += [gguf.TokenType.NORMAL] * len(pieces)
    scores += [-float(rank) for rank in range(len(pieces))]
    tokens += [text for text, _ in spec.added]
    token_types += [token_type for _, token_type in spec.added]
    scores += [spec.special_score] * len(spec.added)
    n_filler = vocab_size - len(tokens)
    tokens += [spec.filler.format(id=len(tokens) + i, n=spec.filler_first + i) for i in range(n_filler)]
    token_types += [spec.filler_type] * n_filler
    scores += [spec.special_score] * n_filler
    return tokens, scores, token_types


@cache
def _sentencepiece_words() -> Counter[tuple[str, ...]]:
    """The corpus's training words (`_PIECE_PATTERN`), each as a tuple of characters, with their counts."""
    words: Counter[tuple[str, ...]] = Counter()
    for line in CORPUS.splitlines():
        words.update(tuple(word) for word in _PIECE_PATTERN.findall(line.replace(" ", SPACE_SYMBOL)))
    return words


@cache
def sentencepiece_characters() -> tuple[str, ...]:
    """Every character of the training words, most frequent first (then by code point)."""
    counts: Counter[str] = Counter()
    for word, count in _sentencepiece_words().items():
        for char in word:
            counts[char] += count
    return tuple(sorted(counts, key=lambda char: (-counts[char], char)))


@cache
def learned_pieces() -> tuple[tuple[str, str], ...]:
    """SentencePiece-style merges learned from `CORPUS` (spaces as `▁`), most frequent first."""
    return tuple(_train_bpe(_sentencepiece_words()))


def _train_bpe(word_counts: Counter[tuple[str, ...]]) -> list[tuple[str, str]]:
    """Classic BPE training with incremental pair counts.

    The next merge is the pair with the highest count; ties go to the pair that
    sorts first, which makes the result independent of dict and set ordering.
    """
    words = [list(word) for word in sorted(word_counts)]
    freqs = [word_counts[tuple(word)] for word in words]
    pair_counts: Counter[tuple[str, str]] = Counter()
    pair_words: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
    for index, word in enumerate(words):
        for pair in itertools.pairwise(word):
            pair_counts[pair] += freqs[index]
            pair_words[pair].add(index)
    # A max-heap by count (then smallest pair) with lazy deletion: stale entries
    # are skipped when their count no longer matches.
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    while heap:
        negative_count, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -negative_count:
            continue
        merges.append(pair)
        changed: set[tuple[str, str]] = set()
        for index in sorted(pair_words.pop(pair)):
            word, freq = words[index], freqs[index]
            for old in itertools.pairwise(word):
                pair_counts[old] -= freq
                changed.add(old)
            word[:] = _merge_pair(word, pair)
            for new in itertools.pairwise(word):
                pair_counts[new] += freq
                pair_words[new].add(index)
                changed.add(new)
        pair_counts.pop(pair, None)
        for other in changed:
            if pair_counts.get(other, 0) > 0:
                heapq.heappush(heap, (-pair_counts[other], other))
    return merges


def _merge_pair(word: list[str], pair: tuple[str, str]) -> list[str]:
    """`word` with every non-overlapping occurrence of `pair`, left to right, fused into one symbol."""
    merged: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            merged.append(word[i] + word[i + 1])
            i += 2
        else:
            merged.append(word[i])
            i += 1
    return merged
