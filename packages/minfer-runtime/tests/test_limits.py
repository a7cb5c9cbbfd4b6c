"""Requests too big for the machine or the context, refused up front with the numbers.

A KV cache larger than the memory it goes into is refused before it is allocated (and an allocation that fails
anyway is one line too); a prompt of more bytes than the context could ever hold is refused before the
tokenizer sees it (millions of words used to abort the process inside the tokenizer).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from engine_steps import needs_cuda
from test_cli import Result, assert_one_line_error, cli_env, minfer_cli

import minfer
from minfer.backends import cpu
from minfer.errors import BackendError, ContextOverflowError
from minfer.sampler import SamplingParams
from minfer.testing.synthetic import scaled, write_synthetic_model
from minfer.tokenizer import Tokenizer

GREEDY = SamplingParams(temperature=0)
HUGE_CTX = 2_000_000_000  # tokens: a context the file claims and no machine holds the KV cache of
# tiny-llama's cache: 2 layers x (K, V) x HUGE_CTX rows x kv_dim 32 (2 KV heads of 16) x 4 bytes.
HUGE_CTX_KV_BYTES = 2 * 2 * HUGE_CTX * 32 * 4


@pytest.fixture(scope="module")
def huge_context_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("huge") / "tiny-llama-huge-context.gguf"
    return write_synthetic_model(path, scaled("tiny-llama", context_length=HUGE_CTX))


# -- the KV cache ---------------------------------------------------------------------------------------


def test_a_kv_cache_larger_than_physical_memory_is_refused_with_the_numbers(huge_context_model, monkeypatch):
    monkeypatch.setattr(cpu, "physical_memory_bytes", lambda: 8 * 2**30)
    engine = minfer.load(huge_context_model, backend="cpu", ctx_size=HUGE_CTX)
    with pytest.raises(BackendError) as error:
        list(engine.generate("Hello", max_tokens=4, sampling=GREEDY))
    assert str(error.value) == (
        f"cpu: the KV cache for --ctx-size {HUGE_CTX} needs {HUGE_CTX_KV_BYTES} bytes (953.7 GiB) but the "
        f"machine's physical memory is {8 * 2**30} bytes (8.0 GiB): lower --ctx-size"
    )
    assert engine.backend.states == {}  # nothing was allocated


def test_an_f16_kv_cache_counts_two_bytes_a_value(huge_context_model, monkeypatch):
    monkeypatch.setattr(cpu, "physical_memory_bytes", lambda: 8 * 2**30)
    engine = minfer.load(huge_context_model, backend="cpu", ctx_size=HUGE_CTX, cache_type="f16")
    with pytest.raises(BackendError) as error:
        list(engine.generate("Hello", max_tokens=4, sampling=GREEDY))
    assert str(error.value).startswith(
        f"cpu: the KV cache for --ctx-size {HUGE_CTX} needs {HUGE_CTX_KV_BYTES // 2} bytes (476.8 GiB) but the "
    )
    assert engine.backend.states == {}


@pytest.mark.parametrize(("cache_type", "value_bytes"), [("f32", 4), ("f16", 2)])
def test_a_kv_cache_that_fits_is_allocated(synthetic_model, monkeypatch, cache_type, value_bytes):
    path = synthetic_model("tiny-llama")
    needed = 2 * 2 * 512 * 32 * value_bytes
    monkeypatch.setattr(cpu, "physical_memory_bytes", lambda: needed)  # exactly enough
    engine = minfer.load(path, backend="cpu", ctx_size=512, cache_type=cache_type)
    assert "".join(engine.generate("Hello", max_tokens=4, sampling=GREEDY))
    assert sum(state.nbytes for state in engine.backend.states.values()) == needed


def test_the_cli_refuses_a_kv_cache_larger_than_the_machine(huge_context_model):
    result = minfer_cli("run", huge_context_model, "Hello", "-c", str(HUGE_CTX), "-n", "4", "--backend", "cpu")
    assert result.returncode == 1
    assert_one_line_error(
        result, f"KV cache for --ctx-size {HUGE_CTX} needs {HUGE_CTX_KV_BYTES} bytes", "physical memory is"
    )


# The CLI with the size check passed and the address space capped below the cache: the allocation itself fails.
FAILING_ALLOCATION = (
    "import resource, runpy; from minfer.backends import cpu; cpu.physical_memory_bytes = lambda: 1 << 62; "
    "resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30)); "
    "runpy.run_module('minfer.cli', run_name='__main__', alter_sys=True)"
)


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_AS is POSIX")
def test_a_kv_cache_allocation_that_fails_anyway_is_one_line(huge_context_model):
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            FAILING_ALLOCATION,
            "run",
            str(huge_context_model),
            "Hello",
            "-c",
            str(HUGE_CTX),
            "--backend",
            "cpu",
        ],
        capture_output=True,
        env=cli_env(),
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    result = Result(completed.returncode, completed.stdout.decode(), completed.stderr.decode())
    assert result.returncode == 1
    assert_one_line_error(result, f"out of memory allocating the KV cache for --ctx-size {HUGE_CTX}", "--ctx-size")


@pytest.fixture(scope="module")
def huge_context_cuda_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Head size 32, as the kernels need: kv_dim 2 x 32.
    spec = scaled("tiny-llama", d_model=128, d_ff=256, context_length=HUGE_CTX)
    return write_synthetic_model(tmp_path_factory.mktemp("cuda-huge") / "huge.gguf", spec, weight_type="F16")


@pytest.mark.cuda
def test_cuda_refuses_a_kv_cache_larger_than_the_free_device_memory(huge_context_cuda_model):
    needs_cuda()
    engine = minfer.load(huge_context_cuda_model, backend="cuda", ctx_size=HUGE_CTX)
    with pytest.raises(BackendError) as error:
        list(engine.generate("Hello", max_tokens=4, sampling=GREEDY))
    message = str(error.value)
    assert message.startswith(f"cuda: the KV cache for --ctx-size {HUGE_CTX} needs {2 * HUGE_CTX_KV_BYTES} bytes ")
    assert "but the device's free memory is" in message and message.endswith(": lower --ctx-size")
    assert engine.backend.states == {}


@pytest.mark.cuda
def test_a_cuda_kv_cache_allocation_that_fails_anyway_names_the_cache(huge_context_cuda_model, monkeypatch):
    needs_cuda()
    import minfer_kernels as mk

    engine = minfer.load(huge_context_cuda_model, backend="cuda", ctx_size=HUGE_CTX)
    _, total = mk.mem_info()
    monkeypatch.setattr(mk, "mem_info", lambda: (1 << 62, total))  # the size check passes; cudaMalloc cannot
    with pytest.raises(BackendError, match=rf"^cuda: out of device memory for the KV cache for --ctx-size {HUGE_CTX} "):
        list(engine.generate("Hello", max_tokens=4, sampling=GREEDY))


# -- prompts too long for any tokenization --------------------------------------------------------------


@pytest.fixture
def engine(synthetic_model) -> minfer.Engine:
    return minfer.load(synthetic_model("tiny-qwen2", "Q8_0"), backend="cpu", ctx_size=256)


def no_tokenizing(engine: minfer.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> list[int]:
        raise AssertionError("the text was tokenized")

    monkeypatch.setattr(engine.tokenizer, "encode", refuse)


# A million characters: far more than 256 tokens can hold, under the chat template's own output budget.
HUGE_PROMPT = "word " * 200_000


@pytest.mark.parametrize("template", [True, False])
def test_a_prompt_no_context_can_hold_is_refused_before_tokenizing(engine, monkeypatch, template):
    no_tokenizing(engine, monkeypatch)
    with pytest.raises(ContextOverflowError, match=r"is at least \d+ tokens, more than the context size 256"):
        engine.encode_prompt(HUGE_PROMPT, template=template)
    with pytest.raises(ContextOverflowError, match="more than the context size 256"):
        list(engine.generate(HUGE_PROMPT, template=template))


def test_a_chat_message_no_context_can_hold_is_refused_before_tokenizing(engine, monkeypatch):
    chat = engine.chat(sampling=GREEDY, max_tokens=8)
    "".join(chat.send("Hello"))
    before = (list(chat.turns), chat.last, chat.context_used)
    no_tokenizing(engine, monkeypatch)
    with pytest.raises(ContextOverflowError, match=r"the message \(at least \d+ tokens with the template\)"):
        "".join(chat.send(HUGE_PROMPT))
    assert (chat.turns, chat.last, chat.context_used) == before


TEXTS = [
    "word " * 60,
    "héllo wörld, 日本語のテキスト 🎉🎉 " * 12,
    "    \n\n\t  \r\n" * 40,
    "<|im_start|>user\nhi<|im_end|>\n" * 12,
    "1234567890" * 30,
    "".join(chr(c) for c in range(32, 1200)),
]


@pytest.mark.parametrize("text", TEXTS, ids=["words", "unicode", "whitespace", "specials", "digits", "code points"])
def test_the_bound_is_never_more_than_the_real_token_count(engine, text):
    """The bound only refuses what cannot fit: it is at most the token count of any text."""
    tokenizer = engine.tokenizer
    assert tokenizer.fewest_tokens(text) <= len(tokenizer.encode(text, add_bos=False))


@pytest.fixture(scope="module")
def default_tokenizer(default_model_gguf) -> Tokenizer:
    return Tokenizer.from_gguf(default_model_gguf)


@pytest.mark.parametrize("text", TEXTS, ids=["words", "unicode", "whitespace", "specials", "digits", "code points"])
def test_the_bound_holds_for_the_default_models_vocabulary(default_tokenizer, text):
    tokenizer = default_tokenizer
    assert tokenizer.max_token_bytes == 81  # its longest token stands for 81 bytes
    assert tokenizer.fewest_tokens(text) <= len(tokenizer.encode(text, add_bos=False))


def test_the_cli_refuses_a_huge_prompt_on_stdin(synthetic_model):
    result = minfer_cli("run", synthetic_model("tiny-llama"), "-n", "4", "--backend", "cpu", stdin=HUGE_PROMPT)
    assert result.returncode == 1
    assert_one_line_error(result, "tokens, more than the context size 512", "--ctx-size")
