"""Model hyperparameters, read from GGUF metadata, checked, and checked against the tensors.

Every value is read with its GGUF type checked (a head count stored as 4.7 or "4" is refused, not
coerced) and its range checked (no zero RoPE dimensions, no NaN epsilon): a file whose numbers do not
describe a model minfer can run right is refused by name. What the rest of the file holds — every other
key and tensor — is accounted for by `minfer.models.audit`, which `from_gguf` runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minfer.errors import ModelFileError
from minfer.gguf_file import GGUFFile
from minfer.models.audit import audit
from minfer.models.rope import RopeConfig, read_rope_config

MAX_CONTEXT = 2**31 - 1  # positions are int32 on every backend


@dataclass(frozen=True)
class ArchitectureSpec:
    """What distinguishes one member of the llama family from another."""

    name: str
    rope_neox: bool  # NeoX rotates pairs (i, i + n_rot/2); the llama layout rotates adjacent pairs


ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "llama": ArchitectureSpec("llama", rope_neox=False),
    "qwen2": ArchitectureSpec("qwen2", rope_neox=True),
}
DEFAULT_ROPE_FREQ_BASE = 10000.0  # llama.cpp's, for every architecture, when rope.freq_base is absent
TENSORS_PER_LAYER = 9  # norms, q/k/v/o and the three FFN matrices: the least a layer of these families holds


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    context_length: int
    rope: RopeConfig
    rms_eps: float
    tied_output: bool
    qkv_bias: bool

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> ModelConfig:
        arch = gguf.architecture
        if arch not in ARCHITECTURES:
            raise ModelFileError(
                f"{gguf.path}: architecture '{arch}' is not supported (supported: {', '.join(sorted(ARCHITECTURES))})"
            )
        spec = ARCHITECTURES[arch]

        def key(name: str) -> str:
            return f"{arch}.{name}"

        def count(name: str, default: int | None = None, *, limit: int = MAX_CONTEXT) -> int:
            value = gguf.get_int(key(name)) if default is None else gguf.get_int(key(name), default)
            if not 1 <= value <= limit:
                raise ModelFileError(f"{gguf.path}: metadata key '{key(name)}' = {value} must be in 1..{limit}")
            return value

        # Each layer holds at least TENSORS_PER_LAYER tensors: a claimed layer count the file cannot back is
        # refused before anything is built per layer.
        n_layers = count("block_count", limit=max(1, len(gguf.tensors) // TENSORS_PER_LAYER))
        d_model = count("embedding_length")
        n_heads = count("attention.head_count")
        head_dim = count("attention.key_length", d_model // n_heads)
        value_length = count("attention.value_length", head_dim)
        if value_length != head_dim:
            raise ModelFileError(
                f"{gguf.path}: metadata key '{key('attention.value_length')}' = {value_length} differs from the "
                f"key length {head_dim}; minfer's attention needs them equal"
            )
        context_length = count("context_length")
        rms_eps = gguf.get_float(key("attention.layer_norm_rms_epsilon"))
        if not (math.isfinite(rms_eps) and 0 < rms_eps < 1):
            raise ModelFileError(
                f"{gguf.path}: metadata key '{key('attention.layer_norm_rms_epsilon')}' = {rms_eps!r} "
                "must be a positive number below 1"
            )
        rope_dim = count("rope.dimension_count", head_dim)
        if rope_dim % 2 or rope_dim > head_dim:
            raise ModelFileError(
                f"{gguf.path}: metadata key '{key('rope.dimension_count')}' = {rope_dim} must be even and at most "
                f"the head size {head_dim}"
            )
        embed = gguf.tensor("token_embd.weight")
        if len(embed.shape) != 2:
            raise ModelFileError(
                f"{gguf.path}: tensor 'token_embd.weight' has shape {list(embed.shape)}; "
                "expected [embedding length, vocabulary size]"
            )
        config = cls(
            architecture=arch,
            n_layers=n_layers,
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=count("attention.head_count_kv", n_heads),
            head_dim=head_dim,
            d_ff=count("feed_forward_length"),
            vocab_size=embed.shape[1],
            context_length=context_length,
            rope=read_rope_config(gguf, arch, rope_dim, DEFAULT_ROPE_FREQ_BASE, spec.rope_neox, context_length),
            rms_eps=rms_eps,
            tied_output="output.weight" not in gguf.tensors,
            qkv_bias="blk.0.attn_q.bias" in gguf.tensors,
        )
        config.check(gguf)
        audit(gguf, config)
        return config

    def check(self, gguf: GGUFFile) -> None:
        """Refuse a file whose hyperparameters or tensors do not fit together, naming the culprit."""
        if self.n_heads % self.n_kv_heads:
            raise ModelFileError(
                f"{gguf.path}: head_count {self.n_heads} is not a multiple of head_count_kv {self.n_kv_heads}"
            )
        vocab_key = f"{self.architecture}.vocab_size"
        if vocab_key in gguf.metadata and gguf.get_int(vocab_key) != self.vocab_size:
            raise ModelFileError(
                f"{gguf.path}: metadata key '{vocab_key}' = {gguf.get_int(vocab_key)} but token_embd.weight has "
                f"{self.vocab_size} rows"
            )
        for name, shape in self.expected_tensors().items():
            actual = gguf.tensor(name).shape
            if actual != shape:
                raise ModelFileError(
                    f"{gguf.path}: tensor '{name}' has shape {list(actual)}, expected {list(shape)} from the metadata"
                )

    def expected_tensors(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of the file the graphs read, with its GGUF shape ([in, out] for weights)."""
        d, q, kv, ff = self.d_model, self.q_dim, self.kv_dim, self.d_ff
        shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (d, self.vocab_size), "output_norm.weight": (d,)}
        if not self.tied_output:
            shapes["output.weight"] = (d, self.vocab_size)
        for layer in range(self.n_layers):
            blk = f"blk.{layer}"
            shapes |= {
                f"{blk}.attn_norm.weight": (d,),
                f"{blk}.attn_q.weight": (d, q),
                f"{blk}.attn_k.weight": (d, kv),
                f"{blk}.attn_v.weight": (d, kv),
                f"{blk}.attn_output.weight": (q, d),
                f"{blk}.ffn_norm.weight": (d,),
                f"{blk}.ffn_gate.weight": (d, ff),
                f"{blk}.ffn_up.weight": (d, ff),
                f"{blk}.ffn_down.weight": (ff, d),
            }
            if self.qkv_bias:
                shapes |= {f"{blk}.attn_q.bias": (q,), f"{blk}.attn_k.bias": (kv,), f"{blk}.attn_v.bias": (kv,)}
        return shapes
