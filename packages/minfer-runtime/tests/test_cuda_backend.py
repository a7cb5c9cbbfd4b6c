"""The CUDA backend against the CPU backend (the quality model), on synthetic and real models.

Every test here needs an NVIDIA GPU and the minfer-kernels package; elsewhere they
skip with the reason (tools/gpu-check.sh sets MINFER_REQUIRE_GPU=1, which turns a
skip into a failure).
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_steps import check_against_reference, needs_cuda, shared_inplace_input_graph
from gguf import GGMLQuantizationType, GGUFWriter
from gguf import quants as gguf_quants

import minfer
from minfer.backends import create_backend
from minfer.errors import BackendError
from minfer.gguf_file import GGUFFile
from minfer.sampler import SamplingParams
from minfer.scheduler import schedule
from minfer.testing.agreement import MAX_LOGIT_ERROR, greedy_steps, relative_error, unexplained_divergence
from minfer.testing.hf_reference import REFERENCES
from minfer.testing.synthetic import WEIGHT_TYPES as SYNTHETIC_WEIGHT_TYPES
from minfer.testing.synthetic import scaled

pytestmark = pytest.mark.cuda
mk = pytest.importorskip("minfer_kernels", reason="minfer-kernels is not installed (it needs nvcc to build)")

GREEDY = SamplingParams(temperature=0)
# Real widths (head size 64, as the kernels need a multiple of 32), fewer layers, to keep the CPU side quick.
SPECS = {
    "llama": scaled("smollm2-135m", n_layers=4, context_length=1024),
    "qwen2": scaled("qwen2.5-0.5b", n_layers=4, context_length=1024),
    # RoPE scaling through the fused decode kernels too: YaRN over Llama 3-style per-pair factors.
    "llama-scaled-rope": scaled(
        "smollm2-135m",
        n_layers=4,
        context_length=1024,
        rope_scaling="yarn",
        rope_scaling_factor=4.0,
        rope_original_context=64,
        rope_freq_factors=tuple(float(f) for f in np.geomspace(1.0, 8.0, 32)),
    ),
    # The families beyond llama's layer: per-head q/k norms (qwen3, gemma3: the QKV kernel without rotation,
    # then decode attention norming and rotating q and k), Gemma's scaled embeddings, sandwich norms, GELU
    # (gemv_geglu in decode), a 16-row window on 5 layers of 6 (the 64-token prompts cross it) with its local
    # RoPE, soft-capped logits; Phi's fused q|k|v and gate|up, partial rotary dims, a window on every layer,
    # LongRoPE past its original context (ctx_size 512 > 256).
    # Their vocabularies are cut to 32768 rows, still past the 16384 from which the output head takes its own
    # kernel path: with 151936 and 262144 rows the CPU side's head made a test take minutes (17 s against 1 s
    # per prompt on 2 cores); "qwen2" keeps a whole 151936-row head.
    "qwen3": scaled("qwen3-0.6b", n_layers=4, context_length=1024, vocab_size=32768),
    "gemma3": scaled(
        "gemma3-270m", n_layers=6, context_length=1024, vocab_size=32768, sliding_window=16, final_logit_softcap=30.0
    ),
    "phi3": scaled("phi4-mini-small", sliding_window=32),
    "phi3-longrope": scaled(
        "phi4-mini-small",
        rope_original_context=256,
        rope_attn_factor=1.19,
        rope_short_factors=tuple(float(f) for f in np.geomspace(1.0, 1.5, 24)),
        rope_long_factors=tuple(float(f) for f in np.geomspace(1.0, 20.0, 24)),
    ),
}
WEIGHT_TYPES = ["F16", "Q8_0", "Q4_0", "Q4_1", "Q4_K_M"]  # Q4_K_M: Q4_K, Q6_K, Q5_0, Q8_0 (and mixed Q|K|V)
PROMPT_TOKENS = 64
CONTINUATION = 64


@pytest.fixture(scope="module", autouse=True)
def cuda_backend_runs() -> None:
    needs_cuda()


def random_prompts(vocab: int, n_prompts: int = 5, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, vocab, size=PROMPT_TOKENS)] for _ in range(n_prompts)]


def compare_backends(
    path, prompts: list[list[int]], ctx_size: int = 512, continuation: int = CONTINUATION, cache_type: str = "f32"
) -> tuple[list[float], list[str]]:
    """Relative logit errors at each prompt's last position, and the greedy continuations that leave the CPU's
    for a reason other than a near-tie (minfer.testing.agreement); both backends' KV caches of `cache_type`."""
    cpu = minfer.load(path, backend="cpu", ctx_size=ctx_size, cache_type=cache_type)
    cuda = minfer.load(path, backend="cuda", ctx_size=ctx_size, cache_type=cache_type)
    errors, divergences = [], []
    for number, prompt in enumerate(prompts):
        reference, ours = greedy_steps(cpu, prompt, continuation), greedy_steps(cuda, prompt, continuation)
        errors.append(relative_error(ours[0][0], reference[0][0]))
        if (divergence := unexplained_divergence(reference, ours)) is not None:
            divergences.append(f"prompt {number}: {divergence}")
    return errors, divergences


@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
@pytest.mark.parametrize("arch", sorted(SPECS))
def test_cuda_matches_cpu_on_synthetic_models(arch, weight_type, synthetic_model):
    spec = SPECS[arch]
    errors, divergences = compare_backends(synthetic_model(spec, weight_type, 1), random_prompts(spec.vocab_size))
    assert max(errors) < MAX_LOGIT_ERROR, f"relative logit errors {errors}"
    assert not divergences, divergences


# The rest of the types llama-quantize's presets give matrices, through a model whose rows are whole 256-value
# super-blocks (Qwen3-0.6B's widths: 1024 and 3072), so the K-quants are not replaced by their fallbacks.
OTHER_TYPES = sorted(set(SYNTHETIC_WEIGHT_TYPES) - set(WEIGHT_TYPES) - {"F32"})


@pytest.mark.parametrize("weight_type", OTHER_TYPES)
def test_cuda_matches_cpu_in_every_weight_type(weight_type, synthetic_model):
    spec = SPECS["qwen3"]
    errors, divergences = compare_backends(synthetic_model(spec, weight_type, 1), random_prompts(spec.vocab_size))
    assert max(errors) < MAX_LOGIT_ERROR, f"relative logit errors {errors}"
    assert not divergences, divergences


@pytest.mark.parametrize("arch", sorted(SPECS))
def test_cuda_matches_cpu_with_an_f16_cache(arch, synthetic_model):
    """An f16 KV cache on both backends: the same values stored (rounded to nearest even once; the head-normed
    families' newest k row is rounded raw, then again normed, on the GPU, once normed on the CPU: attention.cu),
    read back widened, and summed in float32."""
    spec = SPECS[arch]
    prompts = random_prompts(spec.vocab_size)
    errors, divergences = compare_backends(synthetic_model(spec, "Q8_0", 1), prompts, cache_type="f16")
    assert max(errors) < MAX_LOGIT_ERROR, f"relative logit errors {errors}"
    assert not divergences, divergences


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_a_prompt_after_a_long_cached_prefix_matches_cpu(arch, cache_type, synthetic_model):
    """A 1000-token prompt runs as two graphs: 512 tokens from position 0, then 488 at depth 512, whose queries
    see 513 to 1000 rows. With ctx_size 1024 the prompt attention cuts the cache rows into up to 4 slices (one
    per 256 rows of n_ctx, the bound the binder passes) merged through the graph's workspace: heads of 64
    (14/2) and of 128 (16/8). Both graphs' GEMMs stage their Q8_0 weights as f16 rows in that workspace (256
    tokens or more: gemm.cu's staged weights)."""
    spec = SPECS[arch]
    rng = np.random.default_rng(1)
    prompts = [[int(t) for t in rng.integers(3, spec.vocab_size, size=1000)] for _ in range(2)]
    errors, divergences = compare_backends(
        synthetic_model(spec, "Q8_0", 1), prompts, ctx_size=1024, continuation=16, cache_type=cache_type
    )
    assert max(errors) < MAX_LOGIT_ERROR, f"relative logit errors {errors}"
    assert not divergences, divergences


def test_default_model_on_cuda_matches_cpu(default_model_path):
    cpu = minfer.load(default_model_path, backend="cpu")
    questions = ("What is the capital of France?", "Write a haiku.", "Explain gravity.", "List colors.", "Say hi.")
    prompts = [cpu.encode_prompt(text) for text in questions]
    errors, divergences = compare_backends(default_model_path, prompts)
    assert max(errors) < MAX_LOGIT_ERROR, f"relative logit errors {errors}"
    assert not divergences, divergences


def test_gemma3_on_cuda_matches_transformers(gemma3_model_path):
    """The real Gemma 3 270M on the GPU against transformers on the same GGUF, the fixture test_reference.py holds
    the CPU backend to: chat turns, a completion, and a 700-token prompt past the 512-row window of its local
    layers; each prompt through the prefill kernels, then 32 greedy decode steps through the fused ones."""
    engine = minfer.load(gemma3_model_path, backend="cuda", ctx_size=1024)
    check_against_reference(engine, "gemma3", tolerance=CUDA_REFERENCE_TOLERANCE)


def test_graph_replay_on_and_off_give_identical_tokens(synthetic_model, monkeypatch):
    path = synthetic_model(SPECS["qwen2"], "Q4_0", 1)
    prompt = random_prompts(SPECS["qwen2"].vocab_size, 1, seed=3)[0]
    replayed = minfer.load(path, backend="cuda", ctx_size=512)
    _, with_replay = greedy_steps(replayed, prompt, 32)
    decode = replayed.program(1).compiled
    assert decode.cuda_graph is not None and decode.runs == 31  # warm-up 2, capture 1, replays after
    monkeypatch.setenv("MINFER_NO_CUDA_GRAPH", "1")
    eager = minfer.load(path, backend="cuda", ctx_size=512)
    _, without_replay = greedy_steps(eager, prompt, 32)
    assert eager.program(1).compiled.cuda_graph is None
    assert with_replay == without_replay


def test_greedy_steps_on_the_device_match_one_step_at_a_time(synthetic_model):
    """The greedy steps replayed back to back (argmax into the token input, greedy_advance, the picks read once
    per GREEDY_CAPACITY), across two of those, against forward + argmax per step on the same engine: the same
    picks, and the same cache (the next step's logits)."""
    spec = SPECS["llama"]
    engine = minfer.load(synthetic_model(spec, "Q8_0", 1), backend="cuda", ctx_size=512)
    prompt = random_prompts(spec.vocab_size)[0]
    n = 100  # > GREEDY_CAPACITY (64): two replays' worth of picks
    first = engine.prefill(prompt)[0].argmax("logits")
    expected = [first]
    for step in range(n):
        expected.append(engine.forward([expected[-1]], len(prompt) + step).argmax("logits"))
    expected_logits = engine.forward([5], len(prompt) + n).read("logits")
    engine.reset()
    engine.prefill(prompt)
    program = engine.program(1)
    assert program.compiled.cuda_graph is not None  # the step's graph is captured: greedy_steps replays
    inputs = {"tokens": [first], "positions": [len(prompt)], "kv_len": [len(prompt) + 1]}
    assert program.greedy_steps("logits", inputs, n) == expected[1:]
    assert program.compiled.greedy_graph is not None
    np.testing.assert_array_equal(engine.forward([5], len(prompt) + n).read("logits"), expected_logits)
    engine.reset()
    engine.prefill(prompt)
    assert engine.greedy(first, len(prompt), n) == expected[1:]  # the engine's chunks, as generation runs them


def test_prompt_graphs_are_never_captured(synthetic_model):
    engine = minfer.load(synthetic_model(SPECS["qwen2"], "Q4_0", 1), backend="cuda", ctx_size=512)
    for _ in range(4):
        engine.forward([5, 6, 7], 0)
    prompt = engine.program(3).compiled
    assert prompt.runs == 4 and prompt.cuda_graph is None


@pytest.mark.parametrize("spec", ["qwen2", "gemma3"])
def test_a_prompts_projections_of_one_x_are_one_launch(synthetic_model, spec):
    """q, k and v (with their biases) are one gemm_group launch; gate and up with their SwiGLU one gemm_swiglu
    (Gemma's GeGLU: gemm_geglu); Qwen2's attn_output and ffn_down one gemm launch each, the residual add in its
    epilogue (Gemma's residual adds read the post-block norms instead)."""
    engine = minfer.load(synthetic_model(SPECS[spec], "Q4_0", 1), backend="cuda", ctx_size=512)
    engine.forward(list(range(3, 3 + PROMPT_TOKENS)), 0)
    prompt = engine.program(PROMPT_TOKENS).compiled
    launches = dict(zip((node.name for node in prompt.graph.nodes), prompt.launches, strict=True))
    kernels = {
        "qwen2": {
            "attn_q+attn_k+attn_v+attn_q_bias+attn_k_bias+attn_v_bias": mk.kernels.gemm_group,
            "ffn_gate+ffn_up+ffn_silu+ffn_gated": mk.kernels.gemm_swiglu,
            "attn_output+attn_residual": mk.kernels.gemm,
            "ffn_down+ffn_residual": mk.kernels.gemm,
        },
        "gemma3": {
            "attn_q+attn_k+attn_v": mk.kernels.gemm_group,
            "ffn_gate+ffn_up+ffn_gelu+ffn_gated": mk.kernels.gemm_geglu,
        },
    }[spec]
    for layer in range(SPECS[spec].n_layers):
        for node, kernel in kernels.items():
            assert [launch.kernel for launch in launches[f"blk.{layer}.{node}"]] == [kernel]


@pytest.mark.parametrize("unfused", ["every rule", "the gate/up rule"])
def test_graphs_the_fusion_rules_leave_alone_run_on_the_primitive_kernels(synthetic_model, monkeypatch, unfused):
    """What no rule matches (a new architecture's layer; gate and up of different types) runs as the model's
    primitive ops, and gives the CPU's tokens."""
    from minfer.backends.cuda import backend as cuda_backend
    from minfer.backends.cuda import fuse

    if unfused == "every rule":
        monkeypatch.setattr(cuda_backend, "fuse", lambda graph, weight_type: graph)
    else:
        monkeypatch.setattr(fuse, "fuse_gate_up", lambda g, weight_type: g.result())
    path = synthetic_model(SPECS["qwen2"], "Q4_0", 1)
    errors, divergences = compare_backends(path, random_prompts(SPECS["qwen2"].vocab_size, n_prompts=3))
    assert max(errors) < MAX_LOGIT_ERROR, f"relative logit errors {errors}"
    assert not divergences, divergences
    decode = {node.op.value for node in minfer.load(path, backend="cuda", ctx_size=512).program(1).graph.nodes}
    assert "gemv_swiglu" not in decode
    assert ("silu" in decode) == (unfused == "every rule")


def test_three_turn_chat_equals_rerunning_the_conversation(synthetic_model):
    path = synthetic_model(SPECS["llama"], "Q8_0", 1)
    engine = minfer.load(path, backend="cuda", ctx_size=512)
    chat = engine.chat(sampling=GREEDY, max_tokens=12)
    prefilled = []
    for text in ("First question", "Second one", "And a third"):
        "".join(chat.send(text))
        prefilled.append(chat.last.stats.prompt_tokens)
    fresh = minfer.load(path, backend="cuda", ctx_size=512)
    prompt = fresh.encode_prompt(chat.messages[:-1])
    assert prefilled[2] < len(prompt)  # the third turn reused the cached conversation
    assert "".join(fresh.stream(prompt, max_tokens=12, sampling=GREEDY)) == chat.turns[-1]["content"]


def test_sampling_with_temperature_reads_logits_back(synthetic_model):
    engine = minfer.load(synthetic_model(SPECS["llama"], "Q8_0", 1), backend="cuda", ctx_size=512)
    sampled = SamplingParams(temperature=0.9, seed=11)
    first = "".join(engine.generate("Once upon a time", max_tokens=16, sampling=sampled))
    assert first == "".join(engine.generate("Once upon a time", max_tokens=16, sampling=sampled))


def test_auto_picks_cuda_and_reports_the_device(synthetic_model):
    engine = minfer.load(synthetic_model(SPECS["llama"], "Q8_0", 1), backend="auto", ctx_size=64)
    assert engine.info.backend == "cuda" and "sm_" in engine.info.device


def test_op_timing_tables_time_the_prompt_and_the_replayed_decode_step(synthetic_model, monkeypatch):
    path = synthetic_model(SPECS["qwen2"], "Q4_0", 1)
    plain = "".join(minfer.load(path, backend="cuda", ctx_size=512).generate("timing", max_tokens=8, sampling=GREEDY))
    monkeypatch.setenv("MINFER_OP_TIMING", "1")
    engine = minfer.load(path, backend="cuda", ctx_size=512)
    assert "".join(engine.generate("timing", max_tokens=8, sampling=GREEDY)) == plain
    prompt, decode = engine.backend.op_timing_report().split("\n\n")
    assert prompt.startswith("per-op GPU time, prompt: 1 run")
    for op in ("matmul", "attention", "rms_norm", "rope", "kv_store", "swiglu_f32", "add_bias"):
        assert f"| {op} |" in prompt
    # 7 decode steps: the two warm-up runs untimed, then the five replays of the timed graph.
    assert decode.startswith("per-op GPU time, decode step: 5 runs")
    for op in ("gemv_qkv_rope_store", "attention"):
        assert f"| {op} |" in decode
    compiled = engine.program(1).compiled
    assert compiled.cuda_graph is None  # the timed graph replays instead of the step's own
    nodes = len(compiled.graph.nodes)
    assert compiled.timed_graph.node_count >= 2 * nodes + 1  # a kernel or more a node, an event after each
    total_row = decode.splitlines()[-1].split(" | ")
    assert total_row[1] == str(5 * nodes) and float(total_row[2]) > 0.0


def test_op_timing_of_a_decode_step_without_replay_is_its_own_table(synthetic_model, monkeypatch):
    monkeypatch.setenv("MINFER_OP_TIMING", "1")
    monkeypatch.setenv("MINFER_NO_CUDA_GRAPH", "1")
    engine = minfer.load(synthetic_model(SPECS["qwen2"], "Q4_0", 1), backend="cuda", ctx_size=512)
    list(engine.generate("timing", max_tokens=4, sampling=GREEDY))
    prompt, eager = engine.backend.op_timing_report().split("\n\n")
    assert prompt.startswith("per-op GPU time, prompt: 1 run")
    assert eager.startswith("per-op GPU time, decode step without replay: 3 runs")  # no warm-up: nothing is captured
    assert engine.program(1).compiled.timed_graph is None


def test_weight_registry_reuses_same_size_and_retires_replaced_buffers():
    backend = create_backend("cuda")
    first = backend.weights.register("w", np.arange(64, dtype=np.uint8))
    again = backend.weights.register("w", np.arange(64, dtype=np.uint8)[::-1].copy())
    assert again is first
    bigger = backend.weights.register("w", np.zeros(128, dtype=np.uint8))
    assert bigger is not first and backend.weights.retired == [first] and backend.weights.retired_bytes == 64


def test_out_of_memory_names_the_weight_and_bytes():
    backend = create_backend("cuda")
    huge = np.lib.stride_tricks.as_strided(np.zeros(1, dtype=np.uint8), shape=(1 << 48,), strides=(0,))
    with pytest.raises(
        BackendError, match=r"cuda: out of device memory for weight 'blk\.0\.huge' \(281474976710656 bytes"
    ):
        backend.weights.register("blk.0.huge", huge)


def test_a_weight_type_without_kernels_is_refused_at_load(tmp_path, monkeypatch):
    """Every type the GGUF loader reads has kernels today; should the two lists ever differ, the backend refuses
    a tensor of a type its kernels lack by name, before anything is uploaded."""
    from minfer.backends.cuda import backend as cuda_backend  # needs minfer_kernels: imported past the skip

    monkeypatch.setattr(cuda_backend, "KERNEL_TYPES", cuda_backend.KERNEL_TYPES - {mk.GGMLType.Q5_1})
    path = tmp_path / "q5_1.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("w", gguf_quants.quantize(np.ones((2, 64), dtype=np.float32), GGMLQuantizationType.Q5_1),
                      raw_dtype=GGMLQuantizationType.Q5_1)  # fmt: skip
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(BackendError, match=r"cuda: tensor 'w' is Q5_1; the CUDA kernels read"):
        create_backend("cuda").load_weights(GGUFFile(path), ["w"])


def test_a_failed_precondition_names_the_node_before_any_launch(synthetic_model):
    with pytest.raises(BackendError, match=r"cuda: blk\.0\.rope_q: head size 16 is not a multiple of 32"):
        minfer.load(synthetic_model("tiny-llama", "Q8_0"), backend="cuda").forward([1, 2], 0)


def test_inplace_input_with_other_readers_is_staged_on_the_device():
    d, vocab = 64, 4
    rng = np.random.default_rng(0)
    weights = {
        "table": rng.standard_normal((vocab, d)).astype(np.float32),
        "bias": rng.standard_normal(d).astype(np.float32),
    }
    backend = create_backend("cuda")
    for name, values in weights.items():
        backend.weights.register(name, values)
        backend.weight_types[name] = GGMLQuantizationType.F32
    program = schedule(shared_inplace_input_graph(d, vocab), backend)
    assert program.plan.aliased == {"z"}
    program.run({"tokens": np.array([3, 1], dtype=np.int32)})
    rows = weights["table"][[3, 1]]
    np.testing.assert_allclose(program.read("z"), rows + (rows + weights["bias"]), rtol=1e-6)


# From GEMM_MIN_TOKENS tokens on, a prompt's products run the tensor-core GEMM, which rounds both operands to
# f16 (gemm.cu): a unit roundoff of 2^-11 on every weight and activation, where transformers computes in float32.
# Prefill attention on the tensor cores (heads of 64 and 128) rounds q, K, V and the weights P to f16 too.
# Measured on the H200 (session 9): 1.46e-3 of the largest logit on a Gemma 3 reference (four norms a layer
# around the products), under 1e-3 on the other families. The CPU backend with those roundings applied to its
# operands gives at most 1.73e-3 over every reference's prompts (up to 900 tokens), and the same greedy tokens;
# 3e-3 leaves room for seeds and shapes not tried.
CUDA_REFERENCE_TOLERANCE = 3e-3


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_cuda_matches_transformers_on_converted_models(name, converted_model):
    """llama.cpp's conversions of transformers models of each family and RoPE scaling, prompts up to 900 tokens,
    at the context each reference states (LongRoPE picks its factors by it)."""
    engine = minfer.load(converted_model(name), backend="cuda", ctx_size=REFERENCES[name].context)
    check_against_reference(engine, name, tolerance=CUDA_REFERENCE_TOLERANCE)
