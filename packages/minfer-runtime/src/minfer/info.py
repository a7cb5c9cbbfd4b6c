"""`minfer info`: what a model file holds, without loading its weights."""

from __future__ import annotations

from minfer.chat_template import ChatTemplate
from minfer.gguf_file import GGUFFile
from minfer.model_store import resolve_model
from minfer.models.config import ModelConfig
from minfer.tokenizer import Tokenizer


def describe(model: str) -> str:
    gguf = GGUFFile(resolve_model(model))
    config = ModelConfig.from_gguf(gguf)
    tokenizer = Tokenizer.from_gguf(gguf)
    template = ChatTemplate.from_gguf(gguf, tokenizer)
    mix = ", ".join(f"{name} x{count}" for name, count in gguf.quant_mix().items())
    rows = [
        ("file", f"{gguf.path} ({gguf.file_size / 2**20:.2f} MiB, GGUF v{gguf.version})"),
        ("name", gguf.name),
        ("architecture", config.architecture),
        ("parameters", f"{gguf.n_parameters() / 1e6:.2f} M"),
        ("layers", config.n_layers),
        ("hidden size", config.d_model),
        ("feed-forward size", config.d_ff),
        ("attention heads", f"{config.n_heads} (KV heads {config.n_kv_heads}, head size {config.head_dim})"),
        ("rope", f"{'neox' if config.rope_neox else 'normal'}, theta {config.rope_theta:g}, dims {config.rope_dim}"),
        ("rms norm epsilon", f"{config.rms_eps:g}"),
        ("context length", config.context_length),
        ("output", "tied to token_embd" if config.tied_output else "separate output.weight"),
        ("qkv bias", "yes" if config.qkv_bias else "no"),
        (
            "tokenizer",
            f"{gguf.get('tokenizer.ggml.model')} (pre {gguf.get('tokenizer.ggml.pre', 'default')}), "
            f"{tokenizer.vocab_size} tokens, bos {tokenizer.bos_id}, eos {tokenizer.eos_id}",
        ),
        ("chat template", "ChatML fallback (none in file)" if template.is_fallback else "from file"),
        ("tensors", len(gguf.tensors)),
        ("quant mix", mix),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
