"""Write the logits fixtures the engine is tested against, using HF transformers as the reference.

Run through `nox -s reference` (it installs torch and transformers, which the
tests themselves never need, and downloads llama.cpp's source for its converter).
Two kinds of fixture:

- GGUF first (the default model, minfer's synthetic models): the GGUF's weights
  are dequantized with gguf.quants and loaded into transformers' own Llama /
  Qwen2 implementation in float32.
- transformers first (minfer.testing.hf_reference: Llama 3 RoPE, linear, YaRN;
  Qwen3, Gemma 3, Phi-3 / Phi-4-mini): a tiny model is saved by transformers and
  converted by llama.cpp's own convert_hf_to_gguf.py, as users' files are made;
  the fixture records the converter's metadata and tensor digest, so the tests
  can write the same file again without torch (write_reference_gguf), and this
  script checks they do, and that llama.cpp knows every key the file carries.
  For LongRoPE it records which factors transformers used for each prompt: it
  picks them by the sequence's length, llama.cpp (and so the test) by the
  context, and this script checks the two agree at the reference's context.

For each prompt the fixture records the token ids, the last position's logits
and the greedy continuation. Tests feed the same ids to minfer and compare.

Layout note: llama.cpp's converter permutes the rows of llama's Q and K weights
so that RoPE rotates adjacent pairs; transformers rotates halves. Loading a
llama GGUF into transformers therefore undoes that permutation (qwen2 GGUFs use
NeoX RoPE and are stored unpermuted).
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from minfer.chat_template import ChatTemplate
from minfer.gguf_file import GGUFFile
from minfer.model_store import KNOWN_MODELS, resolve_model
from minfer.models.config import ModelConfig
from minfer.models.rope import FREQ_FACTORS_TENSOR
from minfer.quants import dequantize
from minfer.testing.hf_reference import REFERENCES, HFReference, hf_weights, recorded_metadata, write_reference_gguf
from minfer.testing.synthetic import weights_digest, write_synthetic_model
from minfer.testing.vocab import CORPUS
from minfer.tokenizer import Tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "packages/minfer-runtime/tests/fixtures"
CONTINUATION = 32

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a GPU is in one sentence.",
    "List three prime numbers.",
    "def fibonacci(n):",
    "Translate 'good morning' into Spanish.",
]

# Synthetic models: (fixture name, preset, weight type, seed).
SYNTHETIC = [("synthetic-qwen2", "tiny-qwen2", "Q4_0", 7), ("synthetic-llama", "tiny-llama", "F16", 11)]


def unpermute_rope_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (adjacent-pair RoPE) for transformers (half-split RoPE)."""
    out_dim, in_dim = weight.shape
    head = out_dim // n_heads
    return weight.reshape(n_heads, head // 2, 2, in_dim).swapaxes(1, 2).reshape(out_dim, in_dim)


def hf_model(gguf: GGUFFile, config: ModelConfig) -> torch.nn.Module:
    common = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.d_ff,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.context_length,
        rms_norm_eps=config.rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope.freq_base},
        tie_word_embeddings=config.tied_output,
        attn_implementation="eager",
        torch_dtype=torch.float32,
    )
    if config.architecture == "llama":
        model = LlamaForCausalLM(LlamaConfig(attention_bias=False, mlp_bias=False, **common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(use_sliding_window=False, **common))
    state = {}

    def put(hf_name: str, gguf_name: str, permute_heads: int | None = None) -> None:
        values = dequantize(gguf.tensor(gguf_name))
        if permute_heads is not None and config.architecture == "llama":
            values = unpermute_rope_rows(values, permute_heads)
        state[hf_name] = torch.from_numpy(np.ascontiguousarray(values))

    put("model.embed_tokens.weight", "token_embd.weight")
    put("model.norm.weight", "output_norm.weight")
    put("lm_head.weight", "token_embd.weight" if config.tied_output else "output.weight")
    for i in range(config.n_layers):
        blk, hf = f"blk.{i}", f"model.layers.{i}"
        put(f"{hf}.input_layernorm.weight", f"{blk}.attn_norm.weight")
        put(f"{hf}.post_attention_layernorm.weight", f"{blk}.ffn_norm.weight")
        put(f"{hf}.self_attn.q_proj.weight", f"{blk}.attn_q.weight", config.n_heads)
        put(f"{hf}.self_attn.k_proj.weight", f"{blk}.attn_k.weight", config.n_kv_heads)
        put(f"{hf}.self_attn.v_proj.weight", f"{blk}.attn_v.weight")
        put(f"{hf}.self_attn.o_proj.weight", f"{blk}.attn_output.weight")
        put(f"{hf}.mlp.gate_proj.weight", f"{blk}.ffn_gate.weight")
        put(f"{hf}.mlp.up_proj.weight", f"{blk}.ffn_up.weight")
        put(f"{hf}.mlp.down_proj.weight", f"{blk}.ffn_down.weight")
        if config.qkv_bias:
            put(f"{hf}.self_attn.q_proj.bias", f"{blk}.attn_q.bias")
            put(f"{hf}.self_attn.k_proj.bias", f"{blk}.attn_k.bias")
            put(f"{hf}.self_attn.v_proj.bias", f"{blk}.attn_v.bias")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (config.tied_output and m == "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    return model.eval()


def longrope_factors_in_use(model: torch.nn.Module) -> str | None:
    """Which LongRoPE factors transformers' rotary embedding holds after its last forward ("short" or
    "long": it picks them by the length of the sequence so far); None for a model without LongRoPE."""
    rotary = model.model.rotary_emb
    if getattr(rotary, "rope_type", None) != "longrope":
        return None
    return "short" if torch.equal(rotary.inv_freq, rotary.original_inv_freq) else "long"


@torch.no_grad()
def reference_run(model: torch.nn.Module, ids: list[int]) -> tuple[np.ndarray, list[int], str | None]:
    """Last-position logits for `ids`, the greedy continuation of CONTINUATION tokens (no early stop), and
    the LongRoPE factors transformers used for both (None without LongRoPE)."""
    input_ids = torch.tensor([ids])
    logits = model(input_ids).logits[0, -1].numpy().astype(np.float32)
    factors = longrope_factors_in_use(model)
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=CONTINUATION,
        min_new_tokens=CONTINUATION,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    if longrope_factors_in_use(model) != factors:
        raise SystemExit(
            f"a prompt of {len(ids)} tokens: transformers switched LongRoPE factors while generating, which no "
            f"engine with a KV cache does; keep prompt + {CONTINUATION} within the original context, or the "
            "prompt past it"
        )
    return logits, [int(t) for t in out[0, len(ids) :]], factors


def write_fixture(name: str, path: Path, prompts: list[list[int]], source: str) -> None:
    gguf = GGUFFile(path)
    model = hf_model(gguf, ModelConfig.from_gguf(gguf))
    save_fixture(name, model, prompts, {"model": source, "weights_sha256": weights_digest(gguf)})


def save_fixture(
    name: str, model: torch.nn.Module, prompts: list[list[int]], meta: dict, context: int | None = None
) -> None:
    """Run every prompt and write the fixture. A LongRoPE model needs the `context` the tests run it at:
    llama.cpp uses the long factors when the context exceeds the original one, and every prompt must have
    run on the factors that context picks."""
    arrays: dict[str, np.ndarray] = {}
    used: list[str | None] = []
    for index, ids in enumerate(prompts):
        logits, continuation, factors = reference_run(model, ids)
        arrays[f"ids_{index}"] = np.asarray(ids, dtype=np.int32)
        arrays[f"logits_{index}"] = logits
        arrays[f"greedy_{index}"] = np.asarray(continuation, dtype=np.int32)
        used.append(factors)
    if any(used):
        original = model.config.rope_parameters["original_max_position_embeddings"]
        picked = "long" if context is not None and context > original else "short"
        if context is None or set(used) != {picked}:
            raise SystemExit(
                f"{name}: transformers used LongRoPE factors {used}; llama.cpp at context {context} picks {picked}"
            )
        meta |= {
            "context": context,
            "rope_factors": used,
            "rope_attention_scaling": model.model.rotary_emb.attention_scaling,
        }
    meta |= {
        "prompts": len(prompts),
        "reference": f"transformers {transformers.__version__} ({type(model).__name__}, eager attention, float32), "
        f"torch {torch.__version__}",
    }
    arrays["meta"] = np.array(json.dumps(meta))
    FIXTURES.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(FIXTURES / f"reference_{name}.npz", **arrays)
    print(f"{name}: {len(prompts)} prompts -> {FIXTURES / f'reference_{name}.npz'}")


def save_hf_model(reference: HFReference, folder: Path) -> torch.nn.Module:
    """Save the model as transformers does (config.json, safetensors), with a SentencePiece tokenizer.model
    trained on minfer's small corpus: the converter needs some vocabulary, the math does not."""
    import sentencepiece

    hf_config = reference.hf_config()
    model_class = getattr(transformers, hf_config["architectures"][0])
    config = {key: value for key, value in hf_config.items() if key not in ("architectures", "model_type")}
    model = model_class(model_class.config_class(**config, attn_implementation="eager"))
    state = {name: torch.from_numpy(values) for name, values in hf_weights(reference).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (reference.tied and m == "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(f"{reference.name}: state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(folder)
    tokenizer = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(line for line in CORPUS.splitlines() if line.strip()),
        model_writer=tokenizer,
        vocab_size=480,
        model_type="bpe",
        byte_fallback=True,
    )
    (folder / "tokenizer.model").write_bytes(tokenizer.getvalue())
    return model.eval()


def write_converted_fixture(reference: HFReference, llama_cpp: Path, workdir: Path, rng: np.random.Generator) -> None:
    folder = workdir / reference.name
    model = save_hf_model(reference, folder)
    converted = workdir / f"{reference.name}.gguf"
    converter = llama_cpp / "convert_hf_to_gguf.py"
    subprocess.run([sys.executable, converter, "--outtype", "f32", "--outfile", converted, folder], check=True)
    gguf = GGUFFile(converted)
    extra = [name for name in gguf.tensors if name == FREQ_FACTORS_TENSOR]
    meta = {
        "model": f"{reference.name} (minfer.testing.hf_reference), converted by {llama_cpp.name}/{converter.name}",
        "reference_model": reference.name,
        "weights_sha256": weights_digest(gguf),
        "metadata": recorded_metadata(converted),
        "extra_tensors": {name: [float(v) for v in gguf.tensors[name].data.view(np.float32)] for name in extra},
    }
    unknown = [key for key, *_ in meta["metadata"] if key not in llama_cpp_keys(llama_cpp, reference.architecture)]
    if unknown:
        raise SystemExit(f"{reference.name}: the converter wrote keys llama.cpp does not know: {unknown}")
    copy = write_reference_gguf(workdir / f"{reference.name}-copy.gguf", reference, meta)
    if weights_digest(GGUFFile(copy)) != meta["weights_sha256"]:
        raise SystemExit(f"{reference.name}: write_reference_gguf does not reproduce the converter's tensors")
    prompts = [[int(t) for t in rng.integers(3, reference.vocab_size, size=n)] for n in reference.prompt_lengths]
    save_fixture(reference.name, model, prompts, meta, context=reference.context)


def write_gemma3_fixture() -> None:
    """The real Gemma 3 270M, loaded by transformers from the same GGUF (`gguf_file=`, dequantized to float32):
    the chat prompts through the built-in Gemma template (the file has none), a plain completion, and the
    first 700 tokens of the corpus, past the 512-row window of its sliding-window layers."""
    known = KNOWN_MODELS["gemma3"]
    path = resolve_model(known.name)
    gguf = GGUFFile(path)
    tokenizer = Tokenizer.from_gguf(gguf)
    template = ChatTemplate.from_gguf(gguf, tokenizer)
    prompts = [
        tokenizer.encode(template.render([{"role": "user", "content": text}], add_generation_prompt=True))
        for text in CHAT_PROMPTS[:3]
    ]
    prompts += [tokenizer.encode("The capital of France is"), tokenizer.encode(CORPUS)[:700]]
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    meta = {"model": f"{known.requirement}/{known.filename}", "weights_sha256": weights_digest(gguf)}
    save_fixture("gemma3", model.eval(), prompts, meta)


def llama_cpp_keys(llama_cpp: Path, architecture: str) -> set[str]:
    """Every metadata key llama.cpp names (LLM_KV_NAMES in src/llama-arch.cpp), under `architecture`'s prefix."""
    source = (llama_cpp / "src/llama-arch.cpp").read_text()
    return {key % architecture if "%s" in key else key for key in re.findall(r'\{\s*LLM_KV_\w+,\s*"([^"]+)"', source)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/minfer-reference"))
    parser.add_argument(
        "--llama-cpp", type=Path, required=True, help="llama.cpp's source, its folder named after its version"
    )
    parser.add_argument("--only", nargs="*", help="write only these fixtures (default: all)")
    args = parser.parse_args()
    torch.manual_seed(0)
    args.workdir.mkdir(parents=True, exist_ok=True)

    def wanted(name: str) -> bool:
        return not args.only or name in args.only

    if wanted("smollm2"):
        default = KNOWN_MODELS["smollm2"]
        path = resolve_model(default.name)
        gguf = GGUFFile(path)
        tokenizer = Tokenizer.from_gguf(gguf)
        template = ChatTemplate.from_gguf(gguf, tokenizer)
        prompts = [
            tokenizer.encode(template.render([{"role": "user", "content": text}], add_generation_prompt=True))
            for text in CHAT_PROMPTS
        ]
        write_fixture("smollm2", path, prompts, f"{default.requirement}/{default.filename}")

    if wanted("gemma3"):
        write_gemma3_fixture()

    rng = np.random.default_rng(2026)  # the synthetic fixtures' prompts, drawn in this order
    for name, preset, weight_type, seed in SYNTHETIC:
        synthetic = write_synthetic_model(args.workdir / f"{name}.gguf", preset, weight_type=weight_type, seed=seed)
        vocab = ModelConfig.from_gguf(GGUFFile(synthetic)).vocab_size
        prompts = [[int(t) for t in rng.integers(3, vocab, size=n)] for n in (1, 7, 16, 33, 64)]
        if wanted(name):
            source = f"minfer.testing.synthetic preset={preset} {weight_type} seed={seed}"
            write_fixture(name, synthetic, prompts, source)

    for name, reference in REFERENCES.items():
        if wanted(name):
            write_converted_fixture(reference, args.llama_cpp, args.workdir, np.random.default_rng(reference.seed))


if __name__ == "__main__":
    main()
