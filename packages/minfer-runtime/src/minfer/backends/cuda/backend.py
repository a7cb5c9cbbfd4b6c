"""The CUDA backend: every op of the llama-family graph on the GPU, one graph launch per step.

Compiling a graph checks every node's preconditions (raising an error that names
the node before anything launches) and binds each node to its kernel launches
with every pointer resolved, so running is a loop over prepared calls. Runs 1-2
of a one-token (decode) graph launch node by node (warm-up); run 3 is captured
into a CUDA graph on the backend's own stream (thread-local mode, nothing
synchronizes inside the window); later runs replay it with one launch. Positions,
token ids and the KV length are device data written before each run, so one
decode graph serves every step. Prompt graphs always launch node by node: their
kernels run long enough to hide every launch, and a capture would only add its
instantiation to a prompt that is rarely repeated. MINFER_NO_CUDA_GRAPH=1 turns replay off; MINFER_OP_TIMING=1 times
every node with events (and also runs node by node).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

import minfer_kernels as mk
from minfer.backends.base import (
    Backend,
    CompiledGraph,
    LoadProgress,
    ProgressCallback,
    check_states_fit,
    checked_inputs,
)
from minfer.backends.cuda.gemm_groups import GEMM_GROUP_PARTS, gemm_groups, on_tensor_cores
from minfer.backends.cuda.memory import Readback, ScratchPool, StagingRing, WeightRegistry, allocate
from minfer.backends.cuda.timing import OpTimer
from minfer.errors import BackendError, NumericalError
from minfer.gguf_file import GGUFFile, TensorInfo
from minfer.graph.alloc import BufferPlan
from minfer.graph.ir import Graph, Node, Op, Tensor, TensorKind

# Weight and table formats the kernels read directly (their GGML type ids are the kernels' type ids).
KERNEL_TYPES = frozenset(
    {
        GGMLQuantizationType.F32,
        GGMLQuantizationType.F16,
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q4_1,
        GGMLQuantizationType.Q5_0,
        GGMLQuantizationType.Q8_0,
        GGMLQuantizationType.Q4_K,
        GGMLQuantizationType.Q6_K,
    }
)
MAX_ROWS_PER_LAUNCH = 65535  # rows sit on a grid's y axis
# Cache splits of decode attention, fixed so a captured graph stays valid (a short cache leaves most empty:
# a split is at least 32 rows). Each block loads its split in one round trip and the last one merges, so
# fewer splits mean more rows per block and more splits a longer merge; at depth 2048 on the H200, 64
# splits gave 1343 tok/s against 1191 (16), 1273 (32) and 1232 (128): docs/PERFORMANCE.md, step 19.
DECODE_ATTENTION_SPLITS = 64


def replay_enabled() -> bool:
    return os.environ.get("MINFER_NO_CUDA_GRAPH", "") in ("", "0")


def op_timing_enabled() -> bool:
    return os.environ.get("MINFER_OP_TIMING", "") not in ("", "0")


@dataclass(frozen=True)
class Launch:
    """One prepared kernel call: the launcher and its arguments, pointers already resolved."""

    kernel: Callable[..., None]
    args: tuple


class CudaCompiledGraph(CompiledGraph):
    WARMUP_RUNS = 2  # runs before the capture, as llama.cpp does: first-use costs stay out of the graph

    def __init__(self, backend: CudaBackend, graph: Graph, plan: BufferPlan) -> None:
        self.backend = backend
        self.graph = graph
        self.plan = plan
        for name, values in graph.constants.items():
            backend.weights.register(name, values)  # the registry owns them, like the file's weights
        for node in graph.nodes:
            backend.check(node)
        self.slots = [backend.pool.acquire(n, f"scratch buffer {i}") for i, n in enumerate(plan.slot_nbytes)]
        self.inputs = {name: allocate(t.nbytes, f"input '{name}'") for name, t in graph.inputs.items()}
        self.argmax_out = allocate(4, "the argmax result")
        self.argmax_workspace: mk.DeviceBuffer | None = None  # sized by the first argmax
        self.workspace = allocate(backend.attention_workspace_bytes(graph), "the attention workspace")
        self.gemm_groups = gemm_groups(graph.nodes, self.weight_type)
        grouped = {node.name for run in self.gemm_groups.values() for node in run[1:]}
        self.launches = [[] if node.name in grouped else self.bind(node) for node in graph.nodes]
        self.runs = 0
        tokens = graph.inputs.get("tokens")
        self.replays = replay_enabled() and tokens is not None and tokens.shape[0] == 1  # decode graphs only
        self.cuda_graph: mk.Graph | None = None

    # -- pointers ---------------------------------------------------------------------------------

    def ptr(self, tensor: Tensor) -> int:
        if tensor.kind is TensorKind.ACTIVATION:
            return self.slots[self.plan.slot_of[tensor.name]].ptr
        if tensor.kind is TensorKind.WEIGHT:
            return self.backend.weights.ptr(tensor.name)
        if tensor.kind is TensorKind.STATE:
            return self.backend.states[tensor.name].ptr
        if tensor.kind is TensorKind.CONSTANT:
            return self.backend.weights.ptr(tensor.name)
        return self.inputs[tensor.name].ptr

    # -- binding: one arm per op ------------------------------------------------------------------

    def bind(self, node: Node) -> list[Launch]:
        launches = []
        if node.inplace_input is not None and node.name not in self.plan.aliased and node.op in IN_PLACE_KERNELS:
            # Alias rule: the allocator gave the output its own buffer, so the in-place kernel works on a copy.
            source = node.inputs[node.inplace_input]
            launches.append(
                Launch(mk.copy_d2d, (self.ptr(node.output), self.ptr(source), source.nbytes, self.backend.stream))
            )
        return launches + BINDERS[node.op](self, node)

    def bind_embed(self, node: Node) -> list[Launch]:
        table, tokens = node.inputs
        n_rows, d = table.shape
        kind = int(self.backend.weight_types[table.name])
        args = (self.ptr(table), kind, self.ptr(tokens), self.ptr(node.output), tokens.shape[0], d, n_rows)
        return [Launch(mk.kernels.embed_rows, (*args, self.backend.stream))]

    def bind_rms_norm(self, node: Node) -> list[Launch]:
        x, weight = node.inputs
        rows, d = x.shape
        args = (self.ptr(x), self.ptr(weight), self.ptr(node.output), rows, d, node.params["eps"])
        return [Launch(mk.kernels.rms_norm_f32, (*args, self.backend.stream))]

    def bind_matmul(self, node: Node) -> list[Launch]:
        x, weight = node.inputs
        out_features, in_features = weight.shape
        n_tokens = x.shape[0]
        if (run := self.gemm_groups.get(node.name)) is not None:
            parts: list[int] = []
            for member in run:
                parts += [self.ptr(member.inputs[1]), self.ptr(member.output), member.inputs[1].shape[0]]
            parts += [0, 0, 0] * (GEMM_GROUP_PARTS - len(run))  # absent parts
            args = (*parts, self.weight_type(weight), self.ptr(x), in_features, n_tokens, self.backend.stream)
            return [Launch(mk.kernels.gemm_group, args)]
        args = (self.ptr(weight), self.weight_type(weight), self.ptr(x), self.ptr(node.output), in_features)
        kernel = mk.kernels.gemm if on_tensor_cores(node) else mk.kernels.matmul
        return [Launch(kernel, (*args, out_features, n_tokens, self.backend.stream))]

    def bind_add_bias(self, node: Node) -> list[Launch]:
        rows, d = node.output.shape
        args = (self.ptr(node.output), self.ptr(node.inputs[1]), rows, d)
        return [Launch(mk.kernels.add_bias_f32, (*args, self.backend.stream))]

    def bind_rope(self, node: Node) -> list[Launch]:
        p = node.params
        mode = mk.kernels.ROPE_NEOX if p["neox"] else mk.kernels.ROPE_NORMAL
        _, positions, inv_freq = node.inputs
        args = (self.ptr(node.output), self.ptr(positions), positions.shape[0], p["n_heads"], p["head_dim"])
        rope = (p["rope_dim"], self.ptr(inv_freq), p["mscale"], mode)
        return [Launch(mk.kernels.rope_f32, (*args, *rope, self.backend.stream))]

    def bind_kv_store(self, node: Node) -> list[Launch]:
        k, v, positions = node.inputs
        cache_k, cache_v = node.writes
        n_ctx, kv_dim = cache_k.shape
        args = (self.ptr(k), self.ptr(v), self.ptr(cache_k), self.ptr(cache_v), self.ptr(positions))
        return [Launch(mk.kernels.kv_store_f32, (*args, k.shape[0], kv_dim, n_ctx, self.backend.stream))]

    def bind_attention(self, node: Node) -> list[Launch]:
        q, cache_k, cache_v, positions, kv_len = node.inputs
        p = node.params
        heads = (p["n_heads"], p["n_kv_heads"], p["head_dim"], cache_k.shape[0])
        caches = (self.ptr(q), self.ptr(cache_k), self.ptr(cache_v), self.ptr(node.output))
        if q.shape[0] == 1:
            # Decode reads the KV length from device memory: the same launch serves every step.
            extra = (self.ptr(kv_len), self.workspace.ptr)
            args = (*caches, *extra, *heads, DECODE_ATTENTION_SPLITS, self.backend.stream)
            return [Launch(mk.kernels.attention_decode_f32, args)]
        args = (*caches, self.ptr(positions), q.shape[0], *heads, self.backend.stream)
        return [Launch(mk.kernels.attention_prefill_f32, args)]

    def bind_add(self, node: Node) -> list[Launch]:
        a, b = node.inputs
        args = (self.ptr(a), self.ptr(b), self.ptr(node.output), node.output.n_elements)
        return [Launch(mk.kernels.add_f32, (*args, self.backend.stream))]

    def bind_swiglu(self, node: Node) -> list[Launch]:
        gate, up = node.inputs
        rows, d = node.output.shape
        args = (self.ptr(gate), self.ptr(up), self.ptr(node.output), rows, d, d)
        return [Launch(mk.kernels.swiglu_f32, (*args, self.backend.stream))]

    # The fused ops, one token each (CudaBackend.check): one gemv.cu kernel per node.

    def bind_norm_matmul(self, node: Node) -> list[Launch]:
        x, norm_weight, weight = node.inputs
        out_features, in_features = weight.shape
        head = (self.ptr(weight), self.weight_type(weight), self.ptr(x), self.ptr(norm_weight), node.params["eps"])
        args = (*head, 0, self.ptr(node.output), in_features, out_features, self.backend.stream)  # 0: no residual
        return [Launch(mk.kernels.gemv, args)]

    def bind_matmul_add(self, node: Node) -> list[Launch]:
        x, weight, residual = node.inputs
        out_features, in_features = weight.shape
        head = (self.ptr(weight), self.weight_type(weight), self.ptr(x), 0, 0.0)  # 0: no norm
        args = (*head, self.ptr(residual), self.ptr(node.output), in_features, out_features, self.backend.stream)
        return [Launch(mk.kernels.gemv, args)]

    def bind_norm_swiglu(self, node: Node) -> list[Launch]:
        x, norm_weight, gate_up = node.inputs
        gate, up = self.backend.stacks[gate_up.name]
        pointers = (self.backend.weights.ptr(gate), self.backend.weights.ptr(up))
        kind = int(self.backend.weight_types[gate])  # up's too (CudaBackend.check)
        head = (*pointers, kind, self.ptr(x), self.ptr(norm_weight), node.params["eps"])
        args = (*head, self.ptr(node.output), gate_up.shape[1], node.output.shape[1], self.backend.stream)
        return [Launch(mk.kernels.gemv_swiglu, args)]

    def bind_norm_qkv_rope_store(self, node: Node) -> list[Launch]:
        x, norm_weight, qkv, positions, inv_freq, *bias = node.inputs
        cache_k, cache_v = node.writes
        p = node.params
        weights = self.backend.weights
        parts = [arg for name in self.backend.stacks[qkv.name] for arg in (weights.ptr(name), self.weight_type(name))]
        biases = [weights.ptr(name) for name in self.backend.stacks[bias[0].name]] if bias else [0, 0, 0]
        head = (*parts, self.ptr(x), self.ptr(norm_weight), p["eps"], *biases)
        outputs = (self.ptr(node.output), self.ptr(cache_k), self.ptr(cache_v), self.ptr(positions))
        heads = (qkv.shape[1], p["n_heads"], p["n_kv_heads"], p["head_dim"])
        mode = mk.kernels.ROPE_NEOX if p["neox"] else mk.kernels.ROPE_NORMAL
        rope = (p["rope_dim"], self.ptr(inv_freq), p["mscale"], mode)
        args = (*head, *outputs, *heads, *rope, cache_k.shape[0], self.backend.stream)
        return [Launch(mk.kernels.gemv_qkv_rope_store, args)]

    def weight_type(self, weight: Tensor | str) -> int:
        return int(self.backend.weight_types[weight if isinstance(weight, str) else weight.name])

    def bind_last_row(self, node: Node) -> list[Launch]:
        (x,) = node.inputs
        row_bytes = node.output.nbytes
        source = self.ptr(x) + (x.shape[0] - 1) * row_bytes
        return [Launch(mk.copy_d2d, (self.ptr(node.output), source, row_bytes, self.backend.stream))]

    # -- running ----------------------------------------------------------------------------------

    def run(self, inputs: dict[str, np.ndarray]) -> None:
        for name, value in checked_inputs("cuda", self.graph, inputs).items():
            self.backend.staging.upload(self.inputs[name], value)
        stream = self.backend.stream
        if self.backend.timer is not None:
            self.launch_timed()
        elif self.cuda_graph is not None:
            self.cuda_graph.launch(stream)
        elif self.replays and self.runs >= self.WARMUP_RUNS:
            mk.begin_capture(stream)
            try:
                self.launch_all()
            finally:
                graph = mk.end_capture(stream)
            self.cuda_graph = graph
            self.cuda_graph.launch(stream)
        else:
            self.launch_all()
        self.runs += 1

    def launch_all(self) -> None:
        for launches in self.launches:
            for launch in launches:
                launch.kernel(*launch.args)

    def launch_timed(self) -> None:
        stream = self.backend.stream
        events = [mk.Event() for _ in range(len(self.launches) + 1)]
        events[0].record(stream)
        for index, launches in enumerate(self.launches):
            for launch in launches:
                launch.kernel(*launch.args)
            events[index + 1].record(stream)
        mk.sync(stream)
        self.backend.timer.measure([node.op.value for node in self.graph.nodes], events)

    def read(self, tensor: Tensor) -> np.ndarray:
        buffer = self.slots[self.plan.slot_of[tensor.name]]
        return self.backend.readback.read(buffer, tensor.nbytes, np.dtype(np.float32), tensor.shape)

    def argmax(self, tensor: Tensor) -> int:
        """The greedy pick on the device: only 4 bytes come back."""
        rows, n = tensor.shape
        if rows != 1:
            raise BackendError(f"cuda: argmax of '{tensor.name}' needs one row, it has {rows}")
        needed = mk.kernels.argmax_workspace_bytes(1, n)
        if self.argmax_workspace is None or self.argmax_workspace.nbytes < needed:
            self.argmax_workspace = allocate(needed, "the argmax workspace")  # zeroed, as the kernel needs
        args = (self.ptr(tensor), self.argmax_out.ptr, self.argmax_workspace.ptr, 1, n, self.backend.stream)
        mk.kernels.argmax_f32(*args)
        index = int(self.backend.readback.read(self.argmax_out, 4, np.dtype(np.int32), (1,))[0])
        if index < 0:  # the kernel's mark of a row holding NaN or Inf
            raise NumericalError(f"cuda: non-finite values (NaN or Inf) in '{tensor.name}'")
        return index

    def release(self) -> None:
        """Give the scratch buffers back to the pool (the captured graph that used them goes first)."""
        self.cuda_graph = None
        self.backend.pool.release(self.slots)
        self.slots = []


IN_PLACE_KERNELS = frozenset({Op.ADD_BIAS, Op.ROPE})  # kernels that read and write one buffer

BINDERS: dict[Op, Callable[[CudaCompiledGraph, Node], list[Launch]]] = {
    Op.EMBED: CudaCompiledGraph.bind_embed,
    Op.RMS_NORM: CudaCompiledGraph.bind_rms_norm,
    Op.MATMUL: CudaCompiledGraph.bind_matmul,
    Op.ADD_BIAS: CudaCompiledGraph.bind_add_bias,
    Op.ROPE: CudaCompiledGraph.bind_rope,
    Op.KV_STORE: CudaCompiledGraph.bind_kv_store,
    Op.ATTENTION: CudaCompiledGraph.bind_attention,
    Op.ADD: CudaCompiledGraph.bind_add,
    Op.SWIGLU: CudaCompiledGraph.bind_swiglu,
    Op.LAST_ROW: CudaCompiledGraph.bind_last_row,
    Op.NORM_MATMUL: CudaCompiledGraph.bind_norm_matmul,
    Op.MATMUL_ADD: CudaCompiledGraph.bind_matmul_add,
    Op.NORM_SWIGLU: CudaCompiledGraph.bind_norm_swiglu,
    Op.NORM_QKV_ROPE_STORE: CudaCompiledGraph.bind_norm_qkv_rope_store,
}
FUSED_OPS = frozenset({Op.NORM_MATMUL, Op.MATMUL_ADD, Op.NORM_SWIGLU, Op.NORM_QKV_ROPE_STORE})  # one token each
# Which input of an op is the GGUF weight (or table) its kernel decodes.
WEIGHT_INPUT = {
    Op.EMBED: 0,
    Op.MATMUL: 1,
    Op.MATMUL_ADD: 1,
    Op.NORM_MATMUL: 2,
    Op.NORM_SWIGLU: 2,
    Op.NORM_QKV_ROPE_STORE: 2,
}


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, device: int = 0) -> None:
        mk.set_device(device)
        info = mk.devices()[device]
        self.device_name = f"{info.name} (sm_{info.compute_capability[0]}{info.compute_capability[1]})"
        self.stream_owner = mk.Stream()  # one non-blocking stream per backend: the order of all its work
        self.stream = self.stream_owner.handle
        self.weights = WeightRegistry(self.stream)
        self.weight_types: dict[str, GGMLQuantizationType] = {}
        self.stacks: dict[str, tuple[str, ...]] = {}  # stacked weight -> its parts, in order
        self.states: dict[str, mk.DeviceBuffer] = {}
        self.pool = ScratchPool()
        self.staging = StagingRing(self.stream)
        self.readback = Readback(self.stream)
        self.timer = OpTimer() if op_timing_enabled() else None

    def supports(self, op: Op) -> bool:
        return op in BINDERS

    def load_weights(
        self,
        gguf: GGUFFile,
        names: list[str],
        progress: ProgressCallback | None = None,
        *,
        stacked: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        for name in names:
            tensor = gguf.tensor(name)
            if tensor.qtype not in KERNEL_TYPES:
                raise BackendError(
                    f"cuda: tensor '{tensor.name}' is {tensor.qtype.name}; the CUDA kernels read "
                    f"{', '.join(sorted(t.name for t in KERNEL_TYPES))} (use --backend cpu for this model)"
                )
        # A stacked weight is not built on the device: its parts are registered under their own names and
        # the fused kernels take the parts (each in its own format) — see stacks.
        self.stacks.update(stacked or {})
        report = LoadProgress(gguf, names, progress)
        for name in names:
            self.register(gguf.tensor(name))
            report.loaded(name)
        mk.sync(self.stream)

    def register(self, tensor: TensorInfo) -> None:
        """Upload a tensor's stored bytes into the weight registry under its name."""
        self.weights.register(tensor.name, tensor.raw_bytes())
        self.weight_types[tensor.name] = tensor.qtype

    def weight_nbytes(self, name: str) -> int:
        return self.weights.buffers[name].nbytes  # the file's stored bytes: the kernels read the quantized blocks

    def allocate_states(self, states: list[Tensor]) -> None:
        new = [t for t in states if t.name not in self.states or self.states[t.name].nbytes != t.nbytes]
        free, _ = mk.mem_info()
        check_states_fit(self.name, new, free, "the device's free memory")
        for tensor in new:
            # A new DeviceBuffer holds zeros (csrc/runtime.cpp), so no host copy of the cache's size is needed.
            what = f"the KV cache for --ctx-size {tensor.shape[0]} ('{tensor.name}'; lower --ctx-size)"
            self.states[tensor.name] = allocate(tensor.nbytes, what)

    def compile(self, graph: Graph, plan: BufferPlan) -> CudaCompiledGraph:
        return CudaCompiledGraph(self, graph, plan)

    def attention_workspace_bytes(self, graph: Graph) -> int:
        decode = [n for n in graph.nodes if n.op is Op.ATTENTION and n.inputs[0].shape[0] == 1]
        if not decode:
            return 0
        p = decode[0].params
        return mk.kernels.attention_decode_workspace_bytes(p["n_heads"], p["head_dim"], DECODE_ATTENTION_SPLITS)

    def op_timing_report(self) -> str | None:
        return self.timer.table() if self.timer is not None and self.timer.steps else None

    # -- preconditions, checked for every node when a graph is compiled, before any launch ----------

    def check(self, node: Node) -> None:
        def refuse(reason: str) -> BackendError:
            return BackendError(f"cuda: {node.name}: {reason}")

        rows = (node.output or node.inputs[0]).shape[0]  # tokens: what the kernels put on a grid's y axis
        if rows > MAX_ROWS_PER_LAUNCH:
            raise refuse(f"{rows} rows exceed the {MAX_ROWS_PER_LAUNCH} a launch can cover")
        for tensor in node.inputs:
            parts = self.stacks.get(tensor.name, (tensor.name,))
            if tensor.kind is TensorKind.WEIGHT and not all(part in self.weights for part in parts):
                raise refuse(f"weight '{tensor.name}' is not in the weight registry")
            if tensor.kind is TensorKind.STATE and tensor.name not in self.states:
                raise refuse(f"state '{tensor.name}' is not allocated")
        if node.op in WEIGHT_INPUT:
            weight = node.inputs[WEIGHT_INPUT[node.op]]
            for part in self.stacks.get(weight.name, (weight.name,)):
                try:
                    mk.row_bytes(int(self.weight_types[part]), weight.shape[1])
                except ValueError as exc:
                    raise refuse(f"weight '{part}': {exc}") from None
        if node.op is Op.NORM_SWIGLU:
            gate, up = self.stacks[node.inputs[2].name]
            if self.weight_types[gate] != self.weight_types[up]:
                raise refuse(f"'{gate}' and '{up}' differ in type; the fused gate/up kernel reads one format")
        if node.op in FUSED_OPS:
            if rows != 1:
                raise refuse(f"fused op '{node.op.value}' runs one token; this node has {rows}")
            in_features = node.inputs[WEIGHT_INPUT[node.op]].shape[1]
            if in_features % 8:
                raise refuse(f"the one-token kernels need rows of a multiple of 8 values, not {in_features}")
        if node.op is Op.ADD and node.inputs[0].shape != node.inputs[1].shape:
            raise refuse(f"add input size mismatch ({node.inputs[0].shape} vs {node.inputs[1].shape})")
        if node.op in (Op.ROPE, Op.ATTENTION, Op.NORM_QKV_ROPE_STORE):
            head_dim = node.params["head_dim"]
            if head_dim % 32 or head_dim > 256:
                raise refuse(f"head size {head_dim} is not a multiple of 32 up to 256, as the kernels need")
        if node.op is Op.ATTENTION and node.params["n_heads"] % node.params["n_kv_heads"]:
            raise refuse("query heads are not a multiple of the KV heads")
