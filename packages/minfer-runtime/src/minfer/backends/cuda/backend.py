"""The CUDA backend: every op of a lowered graph on the GPU, one graph launch per step.

`lower` rewrites the model's primitive graph into the fused ops the kernels implement (fuse.py).
Compiling the lowered graph takes its buffers, checks every node (raising an error that names the node
before anything launches) and binds each node to its kernel launches with every argument resolved
(binders.py), so running is a loop over prepared calls. Runs 1-2 of a one-token (decode) graph launch
node by node (warm-up); run 3 is captured into a CUDA graph on the backend's own stream (thread-local
mode, nothing synchronizes inside the window); later runs replay it with one launch. Positions, token ids
and the KV length are device data written before each run, so one decode graph serves every step. Prompt
graphs always launch node by node: their kernels run long enough to hide every launch, and a capture
would only add its instantiation to a prompt that is rarely repeated. MINFER_NO_CUDA_GRAPH=1 turns replay
off; MINFER_OP_TIMING=1 times every node with events (timing.py), a replayed step in a graph of its own.
"""

from __future__ import annotations

import enum
import os

import numpy as np

import minfer_kernels as mk
from minfer.backends.base import (
    Backend,
    CompiledGraph,
    LoadProgress,
    ProgressCallback,
    check_states_fit,
    checked_inputs,
)
from minfer.backends.cuda.binders import BINDERS, Launch, graph_workspace_bytes, refuse, staging_copy
from minfer.backends.cuda.fuse import fuse
from minfer.backends.cuda.memory import Readback, ScratchPool, StagingRing, WeightRegistry, allocate
from minfer.backends.cuda.timing import OpTimer
from minfer.errors import BackendError, NumericalError
from minfer.gguf_file import GGUFFile
from minfer.graph.alloc import BufferPlan
from minfer.graph.ir import Graph, Node, Tensor, TensorKind

KERNEL_TYPES = frozenset(mk.GGMLType)  # the weight and table formats the kernels read (their one list)
MAX_ROWS_PER_LAUNCH = 65535  # rows sit on a grid's y axis


def env_flag(name: str) -> bool:
    """Whether the environment variable `name` is set to anything but empty or 0."""
    return os.environ.get(name, "") not in ("", "0")


class CudaCompiledGraph(CompiledGraph):
    """A lowered graph's buffers, checks and launches, and the replay state machine that runs them."""

    WARMUP_RUNS = 2  # runs before the capture, as llama.cpp does: first-use costs stay out of the graph
    GREEDY_CAPACITY = 64  # picks a replay of greedy steps keeps on the device before they are read back
    DECODE_INPUTS = frozenset({"tokens", "positions", "kv_len"})  # what greedy_advance moves on

    def __init__(self, backend: CudaBackend, graph: Graph, plan: BufferPlan) -> None:
        self.backend = backend
        self.graph = graph
        self.plan = plan
        self.stream = backend.stream
        self.multiprocessors = backend.multiprocessors
        for name, values in graph.constants.items():
            backend.weights.register(name, values)  # the registry owns them, like the file's weights
        self.slots = [backend.pool.acquire(n, f"scratch buffer {i}") for i, n in enumerate(plan.slot_nbytes)]
        self.inputs = {name: allocate(t.nbytes, f"input '{name}'") for name, t in graph.inputs.items()}
        self.argmax_out = allocate(4, "the argmax result")
        self.argmax_workspace: mk.DeviceBuffer | None = None  # sized by the first argmax
        workspace_bytes = graph_workspace_bytes(graph.nodes, backend.multiprocessors, backend.weight_type)
        workspace = allocate(workspace_bytes, "the graph's workspace")
        self.workspace_buffer = workspace  # held while the launches that read its address live
        self.workspace, self.workspace_bytes = workspace.ptr, workspace.nbytes
        self.launches = [self.bind(node) for node in graph.nodes]
        self.runs = 0
        tokens = graph.inputs.get("tokens")
        decode = tokens is not None and tokens.shape[0] == 1  # only one-token graphs are replayed
        self.decode = decode
        self.replays = decode and not env_flag("MINFER_NO_CUDA_GRAPH")
        self.cuda_graph: mk.CudaGraph | None = None
        self.timed_graph: mk.CudaGraph | None = None  # the step with an event after each node (MINFER_OP_TIMING=1)
        self.timed_marks: list[mk.Event] = []
        self.greedy_graph: mk.CudaGraph | None = None  # the step, its argmax and greedy_advance (greedy_steps)
        self.greedy_picks = allocate(4 * self.GREEDY_CAPACITY, "the greedy picks")
        self.greedy_step = allocate(4, "the greedy step counter")

    def ptr(self, tensor: Tensor) -> int:
        return self.storage(tensor).ptr

    def weight_type(self, tensor: Tensor) -> int:
        return self.backend.weight_type(tensor.name)

    def check(self, node: Node) -> None:
        """What every kernel needs of a node: rows a grid can cover, its weights loaded in a format the
        kernels read at this row length, its states allocated. Each binder checks what its kernel adds."""
        rows = (node.output or node.inputs[0]).shape[0]  # tokens: what the kernels put on a grid's y axis
        if rows > MAX_ROWS_PER_LAUNCH:
            raise refuse(node, f"{rows} rows exceed the {MAX_ROWS_PER_LAUNCH} a launch can cover")
        for tensor in node.inputs:
            if tensor.kind is TensorKind.WEIGHT:
                if tensor.name not in self.backend.weights:
                    raise refuse(node, f"weight '{tensor.name}' is not in the weight registry")
                try:
                    mk.row_bytes(self.weight_type(tensor), tensor.shape[-1])
                except ValueError as exc:
                    raise refuse(node, f"weight '{tensor.name}': {exc}") from None
            if tensor.kind is TensorKind.STATE and tensor.name not in self.backend.states:
                raise refuse(node, f"state '{tensor.name}' is not allocated")

    def bind(self, node: Node) -> list[Launch]:
        self.check(node)
        staging = staging_copy(self, node) if self.plan.stages(node) else []
        return staging + BINDERS[node.op](self, node)

    # -- running ----------------------------------------------------------------------------------

    def run(self, inputs: dict[str, np.ndarray]) -> None:
        for name, value in checked_inputs("cuda", self.graph, inputs).items():
            self.backend.staging.upload(self.inputs[name], value)
        stream = self.stream
        if self.backend.timer is not None:
            self.run_timed()
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
                launch()

    def run_timed(self) -> None:
        """A run under MINFER_OP_TIMING=1. A step that replays is timed as it runs, in a graph: its warm-up runs
        go untimed, then one capture of the launches with an event after each node is replayed for every step.
        Any other run (a prompt, a step with replay off) launches node by node between the events."""
        stream = self.stream
        if self.replays and self.runs < self.WARMUP_RUNS:
            self.launch_all()
            return
        if self.replays:
            if self.timed_graph is None:
                self.timed_marks = [mk.Event() for _ in range(len(self.launches) + 1)]
                mk.begin_capture(stream)
                try:
                    self.launch_marked(self.timed_marks)
                finally:
                    graph = mk.end_capture(stream)
                self.timed_graph = graph
            self.timed_graph.launch(stream)
            kind, marks = "decode step", self.timed_marks
        else:
            marks = [mk.Event() for _ in range(len(self.launches) + 1)]
            self.launch_marked(marks)
            kind = "decode step without replay" if self.decode else "prompt"
        mk.sync(stream)
        self.backend.timer.measure(kind, [node.op.value for node in self.graph.nodes], marks)

    def launch_marked(self, marks: list[mk.Event]) -> None:
        """Every node's launches, marks[0] recorded before them and marks[i + 1] after node i's."""
        marks[0].record(self.stream)
        for launches, mark in zip(self.launches, marks[1:], strict=True):
            for launch in launches:
                launch()
            mark.record(self.stream)

    def read(self, tensor: Tensor) -> np.ndarray:
        return self.backend.readback.read(self.storage(tensor), tensor.nbytes, np.dtype(np.float32), tensor.shape)

    def argmax(self, tensor: Tensor) -> int:
        """The greedy pick on the device: only 4 bytes come back."""
        self.launch_argmax(tensor, self.argmax_out)
        index = int(self.backend.readback.read(self.argmax_out, 4, np.dtype(np.int32), (1,))[0])
        if index < 0:  # the kernel's mark of a row holding NaN or Inf
            raise NumericalError(f"cuda: non-finite values (NaN or Inf) in '{tensor.name}'")
        return index

    def launch_argmax(self, tensor: Tensor, out: mk.DeviceBuffer) -> None:
        """argmax_f32 of a one-row output into `out` (int32), its workspace allocated on first use."""
        rows, n = tensor.shape
        if rows != 1:
            raise BackendError(f"cuda: argmax of '{tensor.name}' needs one row, it has {rows}")
        buffers = dict(x=self.ptr(tensor), out=out.ptr, workspace=self.argmax_space(n).ptr)
        mk.kernels.argmax_f32(**buffers, rows=1, n=n, stream=self.stream)

    def argmax_space(self, n: int) -> mk.DeviceBuffer:
        """The workspace of an argmax over `n` values, allocated (zeroed, as the kernel needs) on first use."""
        needed = mk.kernels.argmax_workspace_bytes(1, n)
        if self.argmax_workspace is None or self.argmax_workspace.nbytes < needed:
            self.argmax_workspace = allocate(needed, "the argmax workspace")
        return self.argmax_workspace

    def greedy_steps(self, logits: Tensor, inputs: dict[str, np.ndarray], n: int) -> list[int]:
        """The steps replayed back to back, the picks read back once per GREEDY_CAPACITY of them: the replayed
        graph is the step, argmax_f32 into the token input and greedy_advance (the position and KV length one
        further, the pick recorded), so no step waits for the host.

        Until the step's own graph is captured (its warm-up runs), with replay off or op timing on, the host
        loop of CompiledGraph.greedy_steps runs instead: the same steps, each pick read back before the next.
        """
        if self.cuda_graph is None or self.backend.timer is not None or set(self.graph.inputs) != self.DECODE_INPUTS:
            return super().greedy_steps(logits, inputs, n)
        if self.greedy_graph is None:
            self.greedy_graph = self.capture_greedy(logits)
        staging, stream = self.backend.staging, self.stream
        for name, value in checked_inputs("cuda", self.graph, inputs).items():
            staging.upload(self.inputs[name], value)
        picks: list[int] = []
        while len(picks) < n:
            count = min(n - len(picks), self.GREEDY_CAPACITY)
            staging.upload(self.greedy_step, np.zeros(1, np.int32))
            for _ in range(count):
                self.greedy_graph.launch(stream)
            self.runs += count
            read = self.backend.readback.read(self.greedy_picks, 4 * count, np.dtype(np.int32), (count,))
            for pick in read.tolist():
                picks.append(pick)
                if pick < 0:  # a row holding NaN or Inf: what followed it is noise
                    return picks
        return picks

    def capture_greedy(self, logits: Tensor) -> mk.CudaGraph:
        """The graph greedy_steps replays: the step's launches, the pick written over the token input, and
        greedy_advance. The argmax workspace exists before the capture (nothing is allocated inside one)."""
        stream = self.stream
        tokens, positions, kv_len = (self.inputs[name] for name in ("tokens", "positions", "kv_len"))
        self.argmax_space(logits.shape[1])
        mk.begin_capture(stream)
        try:
            self.launch_all()
            self.launch_argmax(logits, tokens)
            mk.kernels.greedy_advance(
                token=tokens.ptr, picks=self.greedy_picks.ptr, step=self.greedy_step.ptr, positions=positions.ptr,
                kv_len=kv_len.ptr, capacity=self.GREEDY_CAPACITY, stream=stream,
            )  # fmt: skip
        finally:
            graph = mk.end_capture(stream)
        return graph

    def release(self) -> None:
        """Give the scratch buffers back to the pool (the captured graph that used them goes first)."""
        self.cuda_graph = None
        self.greedy_graph = None
        self.timed_graph = None
        self.backend.pool.release(self.slots)
        self.slots = []


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, device: int = 0) -> None:
        mk.set_device(device)
        info = mk.devices()[device]
        self.device_name = f"{info.name} (sm_{info.compute_capability[0]}{info.compute_capability[1]})"
        self.multiprocessors = info.sm_count  # the count gemm's launcher reads too: it sizes the GEMM workspace
        self.stream_owner = mk.Stream()  # one non-blocking stream per backend: the order of all its work
        self.stream = self.stream_owner.handle
        self.weights = WeightRegistry(self.stream)
        self.weight_types: dict[str, mk.GGMLType] = {}
        self.states: dict[str, mk.DeviceBuffer] = {}
        self.pool = ScratchPool()
        self.staging = StagingRing(self.stream)
        self.readback = Readback(self.stream)
        self.timer = OpTimer() if env_flag("MINFER_OP_TIMING") else None

    def supports(self, op: enum.Enum) -> bool:
        return op in BINDERS

    def weight_type(self, name: str) -> int:
        """The GGML type id of loaded weight `name`, as the kernels take it."""
        return int(self.weight_types[name])

    def lower(self, graph: Graph) -> Graph:
        return fuse(graph, self.weight_type)

    def load_weights(self, gguf: GGUFFile, names: list[str], progress: ProgressCallback | None = None) -> None:
        for name in names:
            tensor = gguf.tensor(name)
            if tensor.qtype not in KERNEL_TYPES:
                raise BackendError(
                    f"cuda: tensor '{tensor.name}' is {tensor.qtype.name}; the CUDA kernels read "
                    f"{', '.join(t.name for t in sorted(KERNEL_TYPES))} (use --backend cpu for this model)"
                )
        report = LoadProgress(gguf, names, progress)
        for name in names:
            tensor = gguf.tensor(name)
            self.weights.register(name, tensor.raw_bytes())  # the stored bytes: the kernels read the file's blocks
            self.weight_types[name] = mk.GGMLType(int(tensor.qtype))
            report.loaded(name)
        mk.sync(self.stream)

    def weight_nbytes(self, name: str) -> int:
        return self.weights[name].nbytes  # the file's stored bytes: the kernels read the quantized blocks

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

    def op_timing_report(self) -> str | None:
        return self.timer.table() if self.timer is not None and self.timer.runs else None
