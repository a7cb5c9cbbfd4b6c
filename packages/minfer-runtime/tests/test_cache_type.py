"""The KV cache's type (llama.cpp's -ctk/-ctv): f32, the default, or f16, here on the CPU backend (the CUDA
backend's f16 cache: test_cuda_backend.py).

An f16 cache holds each K and V value rounded to the nearest float16 (numpy's rounding, ties to even: a relative
error of at most 2^-11 = 4.9e-4), and attention widens the rows it reads back to float32 for its sums. So the f16
engine computes what the f32 one does with each K and V value moved by at most 2^-11 of itself: its logits stay
within 2e-3 of the largest |logit| of the f32 engine's, four times 2^-11, room for every layer's rounding adding up
(measured: 1e-4 to 5.5e-4 of it on these models, Gemma 3's the most).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_cli import assert_one_line_error, minfer_cli

import minfer
from minfer import cli
from minfer.backends import cpu
from minfer.errors import MinferError
from minfer.graph.ir import Op, TensorKind
from minfer.info import describe
from minfer.models import build_graph
from minfer.testing.synthetic import PRESETS, scaled, write_synthetic_model

CTX = 64
PROMPT = [1, 17, 300, 42, 5, 77, 256, 9, 128, 33, 401, 2]  # token ids of the tiny presets' 512-word vocabulary
DECODE_STEPS = 6
F16_LOGITS_BOUND = 2e-3  # of the largest |logit|: 4 x 2^-11 (the module's docstring says why)


# -- the graph -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("cache_type", "dtype"), [("f32", "float32"), ("f16", "float16")])
def test_the_cache_tensors_have_the_cache_types_dtype(cache_type, dtype):
    config = PRESETS["tiny-llama"].config()
    states = build_graph(config, 3, CTX, cache_type).states()
    assert [t.name for t in states] == [f"cache_{kv}.{layer}" for layer in range(config.n_layers) for kv in "kv"]
    assert {(t.dtype, t.shape, t.kind) for t in states} == {(dtype, (CTX, config.kv_dim), TensorKind.STATE)}
    assert {t.dtype for t in build_graph(config, 3, CTX).states()} == {"float32"}  # the default


@pytest.mark.parametrize(
    ("cache_type", "message"),
    [("q8_0", "KV cache type 'q8_0' is llama.cpp's, not supported by minfer (choose from f32, f16)"),
     ("float16", "unknown KV cache type 'float16' (choose from f32, f16)")],
)  # fmt: skip
def test_other_cache_types_are_refused_by_the_graph_and_the_engine(synthetic_model, monkeypatch, cache_type, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        build_graph(PRESETS["tiny-llama"].config(), 1, CTX, cache_type)

    def no_backend(name: str, cache_type: str) -> None:
        raise AssertionError("the backend was created: the weights would have loaded")

    monkeypatch.setattr(minfer.engine, "create_backend", no_backend)
    with pytest.raises(MinferError) as error:
        minfer.load(synthetic_model(), backend="cpu", cache_type=cache_type)
    assert str(error.value) == message


# -- the CPU backend: the store rounds, attention widens ---------------------------------------------------------


def test_attention_over_an_f16_cache_is_attention_over_its_values_widened():
    """The widening is exact: the f16 rows give bit for bit what float32 copies of them give."""
    rng = np.random.default_rng(3)
    n_heads, n_kv_heads, head_dim, kv_len = 4, 2, 16, 9
    q = rng.standard_normal((3, n_heads * head_dim), dtype=np.float32)
    cache_k, cache_v = (rng.standard_normal((CTX, n_kv_heads * head_dim)).astype(np.float16) for _ in "kv")
    positions = np.array([6, 7, 8])
    outs = []
    for k, v in ((cache_k, cache_v), (cache_k.astype(np.float32), cache_v.astype(np.float32))):
        out = np.empty_like(q)
        cpu.attention(q, k, v, positions, kv_len, n_heads, n_kv_heads, head_dim, 0.25, 0, out)
        outs.append(out)
    assert outs[0].dtype == np.float32
    np.testing.assert_array_equal(outs[0], outs[1])


MODELS = ["tiny-llama", "tiny-qwen3", "tiny-gemma3"]  # plain, head-normed q and k, sliding windows and soft cap


def load_both(synthetic_model, preset: str) -> tuple[minfer.Engine, minfer.Engine]:
    """One model on the CPU with each cache type: (f32 engine, f16 engine)."""
    path = synthetic_model(preset, "Q8_0", 5)
    f32, f16 = (minfer.load(path, backend="cpu", ctx_size=CTX, cache_type=t) for t in ("f32", "f16"))
    return f32, f16


@pytest.fixture(scope="module", params=MODELS)
def engines(request, synthetic_model):
    return load_both(synthetic_model, request.param)


def relative_error(logits: np.ndarray, reference: np.ndarray) -> float:
    return float(np.max(np.abs(logits - reference)) / np.max(np.abs(reference)))


def test_f16_cache_logits_stay_within_the_bound_of_the_f32_caches(engines):
    """The prompt's logits, then DECODE_STEPS steps fed the f32 engine's greedy picks (one history for both, so a
    pick that differs cannot make the histories part)."""
    f32, f16 = engines
    reference = f32.forward(PROMPT, 0).read("logits")
    errors = [relative_error(f16.forward(PROMPT, 0).read("logits"), reference)]
    token = int(np.argmax(reference))
    for position in range(len(PROMPT), len(PROMPT) + DECODE_STEPS):
        reference = f32.forward([token], position).read("logits")
        errors.append(relative_error(f16.forward([token], position).read("logits"), reference))
        token = int(np.argmax(reference))
    assert max(errors) <= F16_LOGITS_BOUND, errors
    assert max(errors) > 0  # the cache did round: the engines are not the same computation


@pytest.mark.parametrize("preset", MODELS)
def test_an_f16_cache_holds_float16_rows_each_the_rounded_value_stored(synthetic_model, monkeypatch, preset):
    """Every kv_store writes exactly np.float16 of its float32 K and V rows; layer 0's K and V do not depend on the
    cache, so there the f16 cache is exactly the f32 cache rounded."""
    stored = []
    kv_store = cpu.OPS[Op.KV_STORE]

    def recording(graph, node, ins, out):
        if node.writes[0].dtype == "float16":
            stored.append((node.writes, ins[0].copy(), ins[1].copy(), ins[2].copy()))
        kv_store(graph, node, ins, out)

    monkeypatch.setitem(cpu.OPS, Op.KV_STORE, recording)  # before the engines compile their graphs
    f32, f16 = load_both(synthetic_model, preset)
    for engine in (f32, f16):
        engine.forward(PROMPT, 0)
    assert len(stored) == f16.config.n_layers
    for (cache_k, cache_v), k, v, positions in stored:
        for tensor, rows in ((cache_k, k), (cache_v, v)):
            cache = f16.backend.states[tensor.name]
            assert cache.dtype == np.float16 and tensor.dtype == "float16"
            np.testing.assert_array_equal(cache[positions], rows.astype(np.float16))
            assert not cache[len(PROMPT) :].any()  # rows past the prompt: not written
    for name in ("cache_k.0", "cache_v.0"):
        assert f32.backend.states[name].dtype == np.float32
        np.testing.assert_array_equal(f16.backend.states[name], f32.backend.states[name].astype(np.float16))
    f16_bytes = sum(state.nbytes for state in f16.backend.states.values())
    assert 2 * f16_bytes == sum(state.nbytes for state in f32.backend.states.values())


def test_model_info_names_the_cache_type(engines, synthetic_model):
    assert [engine.info.cache_type for engine in engines] == ["f32", "f16"]
    assert minfer.load(synthetic_model(), backend="cpu").info.cache_type == "f32"  # the default


def test_info_counts_the_cache_at_its_types_bytes(tmp_path):
    """8 layers x (K, V) x 4096 rows x kv_dim 32: 8.4 MB of float32, 4.2 MB of float16."""
    path = write_synthetic_model(tmp_path / "m.gguf", scaled("tiny-llama", n_layers=8, context_length=4096))
    for cache_type, megabytes in (("f32", 8), ("f16", 4)):
        rows = {line.split("  ")[0]: line for line in describe(str(path), cache_type=cache_type).splitlines()}
        assert rows["memory, cpu"].endswith(f"KV cache of {cache_type} at context 4096 ({megabytes} MB)")
        assert rows["memory, cuda"].endswith(f"KV cache of {cache_type} at context 4096 ({megabytes} MB)")


# -- the flags ---------------------------------------------------------------------------------------------------


def parsed(*args: str) -> str:
    return cli.build_parser().parse_args(["run", *args]).cache_type


@pytest.mark.parametrize(
    ("args", "cache_type"),
    [
        ((), "f32"),
        (("-ctk", "f16"), "f16"),  # one flag sets both
        (("--cache-type-v", "f16"), "f16"),
        (("-ctk", "f16", "-ctv", "f16"), "f16"),
        (("-ctk", "f32", "--cache-type-k", "f16"), "f16"),  # a flag given twice: its last value
        (("-ctk", "f32", "-ctv", "f16", "-ctk", "f16"), "f16"),  # K's last value agrees with V
    ],
)
def test_the_flags_give_one_cache_type(args, cache_type):
    assert parsed(*args) == cache_type


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("-ctk", "f16", "-ctv", "f32"), ["argument -ctk/--cache-type-k f16 and -ctv/--cache-type-v f32",
                                           "share one type", "give one of the flags, or both the same type"]),
        (("-ctk", "f16", "-ctv", "f16", "-ctv", "f32"), ["-ctk/--cache-type-k f16 and -ctv/--cache-type-v f32"]),
        (("-ctk", "q4_0"), ["argument -ctk/--cache-type-k:", "'q4_0' is llama.cpp's, not supported by minfer"]),
        (("-ctv", "iq4_nl"), ["argument -ctv/--cache-type-v:", "'iq4_nl' is llama.cpp's"]),
        (("-ctk", "f64"), ["argument -ctk/--cache-type-k: unknown KV cache type 'f64' (choose from f32, f16)"]),
    ],
)  # fmt: skip
def test_bad_flags_are_usage_errors(synthetic_model, args, fragments):
    result = minfer_cli("run", synthetic_model(), "Hello", *args)
    line = assert_one_line_error(result, *fragments)
    assert (
        result.returncode == 2 and line.startswith("minfer run: error: ") and line.endswith("(see minfer run --help)")
    )


@pytest.mark.parametrize("name", ["bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"])
def test_every_other_llama_cpp_cache_type_is_refused_by_name(name):
    with pytest.raises(SystemExit) as exit_status:
        parsed("-ctk", name)
    assert exit_status.value.code == 2


def test_run_generates_with_an_f16_cache(synthetic_model):
    result = minfer_cli("run", synthetic_model(), "Hello", "-n", "4", "--temp", "0", "--backend", "cpu", "-ctv", "f16")
    assert result.returncode == 0, result.stderr
    assert result.stats()["generated"] == "4"
