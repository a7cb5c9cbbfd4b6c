"""The CUDA binders without a GPU: every node of every lowered graph binds, and each launch names exactly
its launcher's parameters (the signature nanobind gives `minfer_kernels`), so a misnamed or missing
argument fails here, not on the device. Needs the minfer-kernels package, not a GPU."""

from __future__ import annotations

import re

import pytest

from minfer.graph.ir import Tensor
from minfer.models import build_graph
from minfer.testing.synthetic import scaled

mk = pytest.importorskip("minfer_kernels", reason="minfer-kernels is not installed (it needs nvcc to build)")
from minfer.backends.cuda.binders import BINDERS  # noqa: E402 (needs minfer_kernels)
from minfer.backends.cuda.fuse import FusedOp, fuse  # noqa: E402


class FakeBinding:
    """Addresses by tensor name, every weight Q8_0: what a binder reads of a compiled graph."""

    stream = 7
    attention_workspace = 1 << 20

    def __init__(self) -> None:
        self.addresses: dict[str, int] = {}

    def ptr(self, tensor: Tensor) -> int:
        return self.addresses.setdefault(tensor.name, (len(self.addresses) + 1) << 12)

    def weight_type(self, tensor: Tensor) -> int:
        return int(mk.GGMLType.Q8_0)


def parameters(kernel) -> list[str]:
    """The parameter names of a nanobind function, from its signature line."""
    signature = kernel.__doc__.splitlines()[0]
    return re.findall(r"(\w+):", signature[signature.index("(") :])


@pytest.mark.parametrize("n_tokens", [1, 3, 64])
@pytest.mark.parametrize("preset", ["smollm2-135m", "qwen2.5-0.5b", "qwen3-0.6b", "gemma3-270m", "phi4-mini-small"])
def test_every_launch_names_exactly_its_launchers_parameters(preset, n_tokens):
    config = scaled(preset, n_layers=6, final_logit_softcap=30.0 if preset.startswith("gemma3") else 0.0).config()
    graph = fuse(build_graph(config, n_tokens, 128), lambda name: int(mk.GGMLType.Q8_0))
    binding = FakeBinding()
    kernels = set()
    for node in graph.nodes:
        for launch in BINDERS[node.op](binding, node):
            kernels.add(launch.kernel.__name__)
            assert sorted(launch.args) == sorted(parameters(launch.kernel)), f"{node.name}: {launch.kernel.__name__}"
    fused = {op.value for op in FusedOp} & {node.op.value for node in graph.nodes}
    assert fused, "the lowering fused nothing"
    # One token: separate q, k and v products go through the fused QKV kernel; where each head of q and k is
    # normed before RoPE, head_norm_rope_f32 norms and rotates them after it; Gemma's GELU gate is gemv_geglu.
    decode = n_tokens == 1
    assert ("gemv_qkv_rope_store" in kernels) == (decode and not config.fused_qkv)
    assert ("head_norm_rope_f32" in kernels) == (decode and config.qk_norm)
    assert ("gemv_geglu" in kernels) == (decode and config.activation == "gelu")
