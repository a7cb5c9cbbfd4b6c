"""Model hyperparameters, read from GGUF metadata and checked against the tensors."""

from __future__ import annotations

from dataclasses import dataclass, replace

from minfer.errors import ModelFileError
from minfer.gguf_file import GGUFFile


@dataclass(frozen=True)
class ArchitectureSpec:
    """What distinguishes one member of the llama family from another."""

    name: str
    rope_neox: bool  # NeoX rotates pairs (i, i + n_rot/2); the llama layout rotates adjacent pairs
    default_rope_theta: float


ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "llama": ArchitectureSpec("llama", rope_neox=False, default_rope_theta=10000.0),
    "qwen2": ArchitectureSpec("qwen2", rope_neox=True, default_rope_theta=1000000.0),
}


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
    rope_theta: float
    rope_dim: int
    rope_neox: bool
    rms_eps: float
    tied_output: bool
    qkv_bias: bool
    # One-token graphs use the fused ops over stacked weights (stacked_tensors). The fused gate/up kernel
    # reads both with one format, so gate and up must share a GGML type, which from_gguf checks; Q, K and
    # V may differ (the Q4_K_M mix gives attn_v more bits).
    fuse_decode: bool = True

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

        n_heads = int(gguf.require(key("attention.head_count")))
        d_model = int(gguf.require(key("embedding_length")))
        head_dim = int(gguf.get(key("attention.key_length"), d_model // max(n_heads, 1)))
        embed = gguf.tensor("token_embd.weight")
        config = cls(
            architecture=arch,
            n_layers=int(gguf.require(key("block_count"))),
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=int(gguf.get(key("attention.head_count_kv"), n_heads)),
            head_dim=head_dim,
            d_ff=int(gguf.require(key("feed_forward_length"))),
            vocab_size=embed.shape[1],
            context_length=int(gguf.require(key("context_length"))),
            rope_theta=float(gguf.get(key("rope.freq_base"), spec.default_rope_theta)),
            rope_dim=int(gguf.get(key("rope.dimension_count"), head_dim)),
            rope_neox=spec.rope_neox,
            rms_eps=float(gguf.require(key("attention.layer_norm_rms_epsilon"))),
            tied_output="output.weight" not in gguf.tensors,
            qkv_bias="blk.0.attn_q.bias" in gguf.tensors,
        )
        config.check(gguf)
        gate_up_match = all(
            gguf.tensor(f"blk.{layer}.ffn_gate.weight").qtype == gguf.tensor(f"blk.{layer}.ffn_up.weight").qtype
            for layer in range(config.n_layers)
        )
        return replace(config, fuse_decode=gate_up_match)

    def check(self, gguf: GGUFFile) -> None:
        """Refuse a file whose hyperparameters or tensors do not fit together, naming the culprit."""
        if self.n_heads <= 0 or self.n_kv_heads <= 0 or self.n_heads % self.n_kv_heads:
            raise ModelFileError(
                f"{gguf.path}: head_count {self.n_heads} is not a positive multiple of head_count_kv {self.n_kv_heads}"
            )
        if self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise ModelFileError(
                f"{gguf.path}: rope.dimension_count {self.rope_dim} must be even and at most "
                f"the head size {self.head_dim}"
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

    def stacked_tensors(self) -> dict[str, tuple[str, ...]]:
        """The tensors the fused decode graph reads that no file holds, each the rows of its parts in order.

        Backends provide them when they load the weights: the CPU backend as one float32 matrix (the
        parts are views of its rows), the CUDA backend as the list of its parts, which one kernel reads
        together (each in its own format).
        """
        stacks: dict[str, tuple[str, ...]] = {}
        for layer in range(self.n_layers):
            blk = f"blk.{layer}"
            stacks[f"{blk}.attn_qkv.weight"] = (f"{blk}.attn_q.weight", f"{blk}.attn_k.weight", f"{blk}.attn_v.weight")
            if self.qkv_bias:
                stacks[f"{blk}.attn_qkv.bias"] = (f"{blk}.attn_q.bias", f"{blk}.attn_k.bias", f"{blk}.attn_v.bias")
            stacks[f"{blk}.ffn_gate_up.weight"] = (f"{blk}.ffn_gate.weight", f"{blk}.ffn_up.weight")
        return stacks

    def graph_tensors(self) -> dict[str, tuple[int, ...]]:
        """GGUF shapes of every tensor a graph may read: the file's, and the stacked ones (the parts' rows,
        on the last GGUF axis, one after the other)."""
        shapes = self.expected_tensors()
        for name, parts in self.stacked_tensors().items():
            part_shapes = [shapes[part] for part in parts]
            shapes[name] = (*part_shapes[0][:-1], sum(shape[-1] for shape in part_shapes))
        return shapes
