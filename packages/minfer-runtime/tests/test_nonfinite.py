"""NaN and Inf in a forward pass: a NumericalError naming the step and position, never a token picked from them.

Without the check, sampling ends in numpy's "zero-size array" ValueError and greedy decoding takes the first
NaN as the largest logit (or, on the GPU, skips every NaN), printing nothing and exiting 0 as if at the end of
the text. The models here are synthetic ones with a tensor patched in the file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from engine_steps import needs_cuda
from test_cli import assert_one_line_error, minfer_cli

from minfer.engine import Engine
from minfer.errors import NumericalError
from minfer.generation import Generation
from minfer.models import build_graph
from minfer.sampler import Sampler, SamplingParams
from minfer.scheduler import schedule
from minfer.testing.synthetic import scaled, write_synthetic_model

GREEDY = SamplingParams(temperature=0)
SAMPLINGS = {
    "greedy": GREEDY,  # the backend's argmax
    "sampled": SamplingParams(temperature=0.8, seed=1),  # the sampler over the logits read back
    "greedy-with-penalty": SamplingParams(temperature=0, repeat_penalty=1.3),  # the sampler's own argmax
}


def poisoned(source: Path, target: Path, tensor: str, value: float, index: int | tuple[int, ...]) -> Path:
    """A copy of the GGUF `source` with element `index` of its F32 tensor `tensor` set to `value`."""
    shutil.copyfile(source, target)
    reader = gguf.GGUFReader(target, "r+")
    (info,) = [t for t in reader.tensors if t.name == tensor]
    assert info.tensor_type == gguf.GGMLQuantizationType.F32, f"{tensor} is {info.tensor_type.name}, not F32"
    info.data[index] = value  # a view of the memory-mapped file
    reader.data.flush()
    return target


def non_finite_message(step: int, position: int) -> str:
    return (
        rf"^non-finite logits \(NaN or Inf\) at generation step {step} \(position {position}\): "
        r"the model's weights or hyperparameters produce NaN/Inf$"
    )


@pytest.fixture(scope="module")
def f32_model(synthetic_model) -> Path:
    return synthetic_model("tiny-llama", "F32")


@pytest.fixture(scope="module", params=[np.nan, np.inf], ids=["nan", "inf"])
def broken_model(request, f32_model, tmp_path_factory) -> Path:
    """One bad value in the first layer's norm weight: every later activation of every position is NaN."""
    target = tmp_path_factory.mktemp("broken") / f"tiny-llama-{request.param}.gguf"
    return poisoned(f32_model, target, "blk.0.attn_norm.weight", request.param, 5)


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
def test_bad_weights_are_reported_at_the_first_step(broken_model, sampling):
    engine = Engine(broken_model, backend="cpu")
    prompt = engine.encode_prompt("Hello there")
    result = Generation()
    with pytest.raises(NumericalError, match=non_finite_message(1, len(prompt))):
        list(engine.stream(prompt, max_tokens=8, sampling=sampling, result=result))
    assert result.tokens == [] and result.text == ""
    assert result.stats.stop_reason == "cancelled"  # not "eos": nothing ended on its own


def test_the_step_and_position_are_those_of_the_first_bad_logits(f32_model, tmp_path):
    """A NaN embedding row of the token the clean model picks second: steps 1 and 2 are fine, step 3 is not."""
    engine = Engine(f32_model, backend="cpu")
    for text in ("Hello there", "Tell me a story", "What is this?", "Go on", "Why?"):
        prompt = engine.encode_prompt(text)
        clean = Generation()
        list(engine.stream(prompt, max_tokens=3, sampling=GREEDY, result=clean))
        if len(clean.tokens) == 3 and clean.tokens[1] not in (*prompt, clean.tokens[0]):
            break
    else:
        pytest.fail("no prompt whose second greedy token is new: pick other prompts")
    first, second = clean.tokens[:2]
    broken = Engine(poisoned(f32_model, tmp_path / "row.gguf", "token_embd.weight", np.nan, (second, 0)), backend="cpu")
    result = Generation()
    pieces = []
    with pytest.raises(NumericalError, match=non_finite_message(3, len(prompt) + 2)):
        pieces.extend(broken.stream(prompt, max_tokens=8, sampling=GREEDY, result=result))
    assert result.tokens == [first, second]  # what came before the bad step was streamed, and only that
    assert "".join(pieces) == result.text


def test_the_cpu_argmax_refuses_non_finite_values(f32_model):
    engine = Engine(f32_model, backend="cpu")
    program = schedule(build_graph(engine.config, 1, engine.ctx_size), engine.backend)
    logits = program.graph.outputs["logits"]
    for value in (np.nan, np.inf, -np.inf):
        row = np.arange(logits.shape[1], dtype=np.float32)
        row[7] = value
        program.compiled.read = lambda tensor, row=row: row[None, :]
        with pytest.raises(NumericalError, match="non-finite values"):
            program.argmax("logits")


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_the_sampler_refuses_non_finite_logits(value):
    logits = np.linspace(-3.0, 3.0, 16)
    logits[3] = value
    with pytest.raises(NumericalError, match="non-finite values"):
        Sampler(SamplingParams(temperature=1.0, seed=0)).sample(logits, [])


@pytest.mark.parametrize("flags", [["--temp", "0"], ["--temp", "0.8", "--seed", "1"]], ids=["greedy", "sampled"])
def test_the_cli_reports_bad_weights_in_one_line(broken_model, flags):
    result = minfer_cli("run", broken_model, "Hello there", "-n", "8", "--backend", "cpu", *flags)
    assert result.returncode == 1
    assert_one_line_error(result, "non-finite logits (NaN or Inf) at generation step 1", "weights or hyperparameters")


@pytest.mark.cuda
@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
def test_cuda_reports_bad_weights_too(tmp_path_factory, sampling):
    """Greedy picks on the device (argmax_f32 marks the row with -1), sampling reads the logits back."""
    needs_cuda()
    folder = tmp_path_factory.mktemp("cuda-broken")
    # Head size 32, as the kernels need.
    clean = write_synthetic_model(folder / "clean.gguf", scaled("tiny-llama", d_model=128, d_ff=256), weight_type="F16")
    engine = Engine(poisoned(clean, folder / "nan.gguf", "blk.0.attn_norm.weight", np.nan, 5), backend="cuda")
    prompt = engine.encode_prompt("Hello there")
    with pytest.raises(NumericalError, match=non_finite_message(1, len(prompt))):
        list(engine.stream(prompt, max_tokens=8, sampling=sampling))


@pytest.mark.cuda
def test_cuda_names_a_bad_pick_made_on_the_device(tmp_path_factory):
    """A NaN embedding row of the token the clean model picks at step 8 or later: by then the greedy steps run
    as replayed chunks (argmax into the token input, greedy_advance), and the -1 pick they record must still be
    a NumericalError naming its step and position, after the clean picks before it."""
    needs_cuda()
    folder = tmp_path_factory.mktemp("cuda-device-pick")
    clean = write_synthetic_model(folder / "clean.gguf", scaled("tiny-llama", d_model=128, d_ff=256), weight_type="F32")
    engine = Engine(clean, backend="cuda")
    prompt = engine.encode_prompt("Tell me a story")
    reference = Generation()
    list(engine.stream(prompt, max_tokens=40, sampling=GREEDY, result=reference))
    tokens = reference.tokens
    new = [k for k in range(7, len(tokens) - 1) if tokens[k] not in (*prompt, *tokens[:k])]
    if not new:
        pytest.fail("no greedy token from step 8 on that is new: pick another prompt")
    k = new[0]  # tokens[k] is step k + 1 at position len(prompt) + k; fed, it makes step k + 2's logits NaN
    broken = Engine(poisoned(clean, folder / "row.gguf", "token_embd.weight", np.nan, (tokens[k], 0)), backend="cuda")
    result = Generation()
    with pytest.raises(NumericalError, match=non_finite_message(k + 2, len(prompt) + k + 1)):
        list(broken.stream(prompt, max_tokens=40, sampling=GREEDY, result=result))
    assert result.tokens == tokens[: k + 1]
