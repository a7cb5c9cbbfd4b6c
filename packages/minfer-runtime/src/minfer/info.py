"""`minfer info`: what a model file holds, without loading its weights."""

from __future__ import annotations

from minfer.backends import cuda_kernel_types
from minfer.chat_template import ChatTemplate, TemplateChoice
from minfer.engine import DEFAULT_CTX_SIZE
from minfer.gguf_file import GGUFFile, printable
from minfer.model_store import resolve_model
from minfer.models.audit import audit
from minfer.models.config import ModelConfig
from minfer.models.llama import DEFAULT_CACHE_TYPE, kv_cache_tensors
from minfer.tokenizer import Tokenizer


def describe(model: str, chat_template: TemplateChoice | None = None, *, cache_type: str = DEFAULT_CACHE_TYPE) -> str:
    """What `minfer info` prints about `model`; `chat_template` is the template given instead of the file's,
    `cache_type` the KV cache's type its memory rows count."""
    gguf = GGUFFile(resolve_model(model))
    config = ModelConfig.from_gguf(gguf)
    tokenizer = Tokenizer.from_gguf(gguf)
    template = ChatTemplate.from_gguf(gguf, tokenizer, chat_template)
    accounted = audit(gguf, config)
    mix = ", ".join(f"{name} x{count}" for name, count in gguf.quant_mix().items())
    rows = [
        ("file", f"{gguf.path} ({gguf.file_size / 2**20:.2f} MiB, GGUF v{gguf.version})"),
        ("name", printable(gguf.name)),
        ("architecture", config.architecture),
        ("parameters", f"{gguf.n_parameters() / 1e6:.2f} M"),
        ("layers", config.n_layers),
        ("hidden size", config.d_model),
        ("feed-forward size", config.d_ff),
        ("attention heads", f"{config.n_heads} (KV heads {config.n_kv_heads}, head size {config.head_dim})"),
        ("rope", config.rope.describe()),
        ("rms norm epsilon", f"{config.rms_eps:g}"),
        ("context length", config.context_length),
        *memory_rows(gguf, config, cache_type),
        ("output", "tied to token_embd" if config.tied_output else "separate output.weight"),
        ("qkv bias", "yes" if config.qkv_bias else "no"),
        (
            "tokenizer",
            f"{gguf.get_str('tokenizer.ggml.model')} (pre {tokenizer.pre_tokenizer}), "
            f"{tokenizer.vocab_size} tokens, bos {tokenizer.bos_id}, eos {tokenizer.eos_id}",
        ),
        ("chat template", template.provenance),
        ("tensors", f"{len(gguf.tensors)}, every one read by the graph (none ignored)"),
        ("quant mix", mix),
        readers_row(gguf),
        ("keys read", f"{len(accounted.read_keys)}: {', '.join(printable(k) for k in accounted.read_keys)}"),
        ("keys ignored", len(accounted.ignored_keys)),
        *(("", f"{', '.join(keys)}: {reason}") for reason, keys in by_reason(accounted.ignored_keys).items()),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def memory_rows(gguf: GGUFFile, config: ModelConfig, cache_type: str) -> list[tuple[str, str]]:
    """What running the file costs in memory on each backend, at the default context size (the engine's rule), with
    a KV cache of `cache_type`."""
    ctx = min(config.context_length, DEFAULT_CTX_SIZE)
    # Every layer's K and V caches, as the graph declares them: 4 bytes a value in f32, 2 in f16.
    layers = range(config.n_layers)
    kv_cache = sum(t.nbytes for layer in layers for t in kv_cache_tensors(config, layer, ctx, cache_type))
    read = config.expected_tensors()
    stored = sum(t.nbytes for name, t in gguf.tensors.items() if name in read)
    as_float32 = 4 * sum(t.n_elements for name, t in gguf.tensors.items() if name in read)
    mb = 1e6
    cache = f"KV cache of {cache_type} at context {ctx} ({kv_cache / mb:.0f} MB)"
    return [
        ("memory, cpu", f"{(as_float32 + kv_cache) / mb:.0f} MB: weights dequantized to float32 at load "
         f"({as_float32 / mb:.0f} MB), {cache}"),
        ("memory, cuda", f"{(stored + kv_cache) / mb:.0f} MB of device memory: weights as stored "
         f"({stored / mb:.0f} MB), {cache}"),
    ]  # fmt: skip


def readers_row(gguf: GGUFFile) -> tuple[str, str]:
    """Which backends read each type of the file: the CPU every type a file may hold, the CUDA backend the
    types its kernels read."""
    cuda = cuda_kernel_types()
    readers = [f"{name}: cpu{', cuda' if cuda is not None and name in cuda else ''}" for name in gguf.quant_mix()]
    missing = "" if cuda is not None else " (cuda: minfer-kernels is not installed)"
    return ("read by", "; ".join(readers) + missing)


def by_reason(ignored: dict[str, str]) -> dict[str, list[str]]:
    """The ignored keys grouped by why they are ignored, each key printable."""
    groups: dict[str, list[str]] = {}
    for key, reason in ignored.items():
        groups.setdefault(reason, []).append(printable(key))
    return groups
