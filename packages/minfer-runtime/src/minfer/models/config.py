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
    """What distinguishes one member of the llama family from another (llama.cpp's src/models/<arch>.cpp)."""

    name: str
    rope_neox: bool  # NeoX rotates pairs (i, i + n_rot/2); the llama layout rotates adjacent pairs
    qk_norm: bool = False  # attn_q_norm / attn_k_norm: an RMS norm of every head of q and k before RoPE
    sandwich_norms: bool = False  # post_attention_norm / post_ffw_norm: each block's output normed too
    fused_gate_up: bool = False  # ffn_up holds gate then up ([d, 2 d_ff]); there is no ffn_gate
    activation: str = "silu"  # the gated FFN's: silu, or gelu (its tanh approximation)
    scaled_embeddings: bool = False  # the embeddings times sqrt(d_model)
    swa_pattern: int = 0  # with a sliding window, every swa_pattern-th layer is global (0: none is)
    local_rope: bool = False  # the windowed layers turn at their own RoPE base (rope.freq_base_swa), unscaled


ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "llama": ArchitectureSpec("llama", rope_neox=False),
    "qwen2": ArchitectureSpec("qwen2", rope_neox=True),
    "qwen3": ArchitectureSpec("qwen3", rope_neox=True, qk_norm=True),
    "gemma3": ArchitectureSpec(
        "gemma3",
        rope_neox=True,
        qk_norm=True,
        sandwich_norms=True,
        activation="gelu",
        scaled_embeddings=True,
        swa_pattern=6,
        local_rope=True,
    ),
    "phi3": ArchitectureSpec("phi3", rope_neox=True, fused_gate_up=True),
}
DEFAULT_ROPE_FREQ_BASE = 10000.0  # llama.cpp's, for every architecture, when rope.freq_base is absent
# llama.cpp's rope_freq_base_train_swa: the RoPE base of Gemma 3's local (sliding-window) layers when the
# file has no rope.freq_base_swa; those layers never scale RoPE (rope_freq_scale_train_swa = 1).
DEFAULT_ROPE_FREQ_BASE_SWA = 10000.0
GEMMA3_27B_LAYERS = 62  # llama.cpp scores Gemma 3 27B by 1/sqrt(d_model / n_heads), every other size by head size
TENSORS_PER_LAYER = 6  # norms, the fused q|k|v, o, fused gate|up and down: the least a layer of these holds


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
    qk_norm: bool = False  # ArchitectureSpec's, for the graph
    sandwich_norms: bool = False
    fused_qkv: bool = False  # attn_qkv holds q, k and v ([d, q_dim + 2 kv_dim]) instead of three tensors
    fused_gate_up: bool = False
    activation: str = "silu"
    embedding_scale: float = 1.0  # the embeddings are multiplied by it (Gemma: sqrt(d_model))
    attention_scale: float | None = None  # attention scores are scale * q.k; None: 1/sqrt(head_dim)
    sliding_window: int = 0  # the rows a windowed layer's query sees, itself included; 0: no window
    windowed_layers: tuple[bool, ...] = ()  # per layer, whether the window applies (empty: no layer)
    rope_local: RopeConfig | None = None  # the windowed layers' own RoPE (Gemma 3); None: `rope`
    final_logit_softcap: float = 0.0  # logits become cap * tanh(logits / cap); 0: not capped

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def score_scale(self) -> float:
        return 1 / math.sqrt(self.head_dim) if self.attention_scale is None else self.attention_scale

    def layer_window(self, layer: int) -> int:
        """The sliding window of `layer`'s attention, 0 for a global one."""
        return self.sliding_window if self.windowed_layers and self.windowed_layers[layer] else 0

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
        n_kv_heads = count("attention.head_count_kv", n_heads)
        window, windowed = read_sliding_window(gguf, arch, spec, n_layers)
        embed = gguf.tensor("token_embd.weight")
        if len(embed.shape) != 2:
            raise ModelFileError(
                f"{gguf.path}: tensor 'token_embd.weight' has shape {list(embed.shape)}; "
                "expected [embedding length, vocabulary size]"
            )
        rope = read_rope_config(gguf, arch, rope_dim, DEFAULT_ROPE_FREQ_BASE, spec.rope_neox, context_length)
        rope_local = None
        if window and spec.local_rope:
            base = gguf.get_float(key("rope.freq_base_swa"), DEFAULT_ROPE_FREQ_BASE_SWA)
            if not (math.isfinite(base) and base > 0):
                raise ModelFileError(f"{gguf.path}: metadata key '{key('rope.freq_base_swa')}' must be positive")
            rope_local = RopeConfig(n_rot=rope_dim, freq_base=base, neox=spec.rope_neox)
        softcap = gguf.get_float(key("final_logit_softcapping"), 0.0) if arch == "gemma3" else 0.0
        if not (math.isfinite(softcap) and softcap >= 0):
            raise ModelFileError(
                f"{gguf.path}: metadata key '{key('final_logit_softcapping')}' = {softcap!r} must be a positive number"
            )
        config = cls(
            architecture=arch,
            n_layers=n_layers,
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            d_ff=count("feed_forward_length"),
            vocab_size=embed.shape[1],
            context_length=context_length,
            rope=rope,
            rms_eps=rms_eps,
            tied_output="output.weight" not in gguf.tensors,
            qkv_bias="blk.0.attn_q.bias" in gguf.tensors,
            qk_norm=spec.qk_norm,
            sandwich_norms=spec.sandwich_norms,
            fused_qkv="blk.0.attn_qkv.weight" in gguf.tensors,
            fused_gate_up=spec.fused_gate_up,
            activation=spec.activation,
            embedding_scale=math.sqrt(d_model) if spec.scaled_embeddings else 1.0,
            attention_scale=attention_scale(arch, n_layers, d_model, n_heads),
            sliding_window=window,
            windowed_layers=windowed,
            rope_local=rope_local,
            final_logit_softcap=softcap,
        )  # fmt: skip
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
            shapes[f"{blk}.attn_norm.weight"] = (d,)
            if self.fused_qkv:
                shapes[f"{blk}.attn_qkv.weight"] = (d, q + 2 * kv)
            else:
                shapes |= {
                    f"{blk}.attn_q.weight": (d, q),
                    f"{blk}.attn_k.weight": (d, kv),
                    f"{blk}.attn_v.weight": (d, kv),
                }
            shapes |= {f"{blk}.attn_output.weight": (q, d), f"{blk}.ffn_norm.weight": (d,)}
            if self.fused_gate_up:
                shapes[f"{blk}.ffn_up.weight"] = (d, 2 * ff)
            else:
                shapes |= {f"{blk}.ffn_gate.weight": (d, ff), f"{blk}.ffn_up.weight": (d, ff)}
            shapes[f"{blk}.ffn_down.weight"] = (ff, d)
            if self.qkv_bias:
                shapes |= {f"{blk}.attn_q.bias": (q,), f"{blk}.attn_k.bias": (kv,), f"{blk}.attn_v.bias": (kv,)}
            if self.qk_norm:
                shapes |= {f"{blk}.attn_q_norm.weight": (self.head_dim,), f"{blk}.attn_k_norm.weight": (self.head_dim,)}
            if self.sandwich_norms:
                shapes |= {f"{blk}.post_attention_norm.weight": (d,), f"{blk}.post_ffw_norm.weight": (d,)}
        return shapes


def read_sliding_window(
    gguf: GGUFFile, arch: str, spec: ArchitectureSpec, n_layers: int
) -> tuple[int, tuple[bool, ...]]:
    """(window, which layers it applies to) from `attention.sliding_window` (absent or 0: no window) and
    `attention.sliding_window_pattern`: a bool per layer, or a period n (every n-th layer global, the others
    windowed: llama.cpp's set_swa_pattern); without it the architecture's period (Gemma 3's 6, else every
    layer windowed). Phi-3's window is honoured, as transformers does (llama.cpp turns it off)."""
    window_key, pattern_key = f"{arch}.attention.sliding_window", f"{arch}.attention.sliding_window_pattern"
    window = gguf.get_int(window_key, 0)
    if window < 0:
        raise ModelFileError(f"{gguf.path}: metadata key '{window_key}' = {window} must be 0 (none) or positive")
    if window == 0:
        return 0, ()
    pattern = gguf.metadata.get(pattern_key, spec.swa_pattern)
    if isinstance(pattern, list):
        if len(pattern) != n_layers or not all(isinstance(v, bool) for v in pattern):
            raise ModelFileError(f"{gguf.path}: metadata key '{pattern_key}' must hold one bool per layer ({n_layers})")
        return window, tuple(pattern)
    period = gguf.get_int(pattern_key, spec.swa_pattern)
    if period < 0:
        raise ModelFileError(f"{gguf.path}: metadata key '{pattern_key}' = {period} must not be negative")
    return window, windowed_layers(period, n_layers)


def windowed_layers(period: int, n_layers: int) -> tuple[bool, ...]:
    """llama.cpp's set_swa_pattern: every period-th layer global, the others windowed (period 0: every one)."""
    return tuple(period == 0 or layer % period < period - 1 for layer in range(n_layers))


def attention_scale(arch: str, n_layers: int, d_model: int, n_heads: int) -> float | None:
    """The score scale when it is not 1/sqrt(head size): llama.cpp's for Gemma 3 27B (1/sqrt(d / heads))."""
    return 1 / math.sqrt(d_model / n_heads) if arch == "gemma3" and n_layers == GEMMA3_27B_LAYERS else None
