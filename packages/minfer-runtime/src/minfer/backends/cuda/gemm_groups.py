"""Which prompt matmuls the CUDA backend runs on the tensor cores, and which of them it runs as one launch.

Pure functions of the graph, without the kernels: the backend binds their answer (CudaCompiledGraph), and
the tests read it on any machine.
"""

from __future__ import annotations

from collections.abc import Callable

from minfer.graph.ir import Node, Op, Tensor

# From this many tokens on, a matmul node runs the tensor-core GEMM instead of the matmul kernel. Measured on
# the H200 (Q4_0, docs/PERFORMANCE.md): at 16 tokens gemm takes 18 us for ffn_up (matmul 81) and ties on
# ffn_down (86 vs 84); at 8 tokens matmul still wins ffn_down (45 vs 86), whose long rows suit its per-row
# dot products better than gemm's few, mostly empty 64-token tiles.
GEMM_MIN_TOKENS = 16
GEMM_K_STEP = 32  # gemm's step along in_features: in_features must be a multiple of it
GEMM_GROUP_PARTS = 3  # products of one x that kernels.gemm_group computes in one launch


def on_tensor_cores(node: Node) -> bool:
    """Whether a matmul node runs the tensor-core GEMM: a prompt's product (gemm walks in_features in whole
    32-value steps, always true of the quantized formats, checked here for F32/F16 weights)."""
    if node.op is not Op.MATMUL:
        return False
    x, weight = node.inputs
    return x.shape[0] >= GEMM_MIN_TOKENS and weight.shape[1] % GEMM_K_STEP == 0


def gemm_groups(nodes: list[Node], weight_type: Callable[[Tensor], int]) -> dict[str, list[Node]]:
    """Runs of consecutive tensor-core matmuls that read the same x with weights of one type and row length,
    up to GEMM_GROUP_PARTS long, keyed by their first node (runs of one are left out). One gemm_group launch
    computes a run, so a layer's narrow q, k and v products share the GPU instead of following each other.
    Computing the later nodes' products at the first node is safe: nothing runs in between, and the buffer
    plan gave their outputs buffers that were already free when the run began (the run's one activation
    input, x, is read up to its last node, so no buffer is released inside the run)."""

    def joins(run: list[Node], node: Node) -> bool:
        first = run[0]
        return (
            len(run) < GEMM_GROUP_PARTS
            and on_tensor_cores(node)
            and node.inputs[0].name == first.inputs[0].name
            and node.inputs[1].shape[1] == first.inputs[1].shape[1]
            and weight_type(node.inputs[1]) == weight_type(first.inputs[1])
        )

    groups: dict[str, list[Node]] = {}
    run: list[Node] = []
    for node in [*nodes, None]:
        if node is not None and run and joins(run, node):
            run.append(node)
            continue
        if len(run) > 1:
            groups[run[0].name] = run
        run = [node] if node is not None and on_tensor_cores(node) else []
    return groups
