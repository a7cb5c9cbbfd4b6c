"""The CUDA backend's lowering: pattern rules that rewrite a model's primitive graph into the fused ops its
kernels implement, and the one choice of the kernel that runs a matmul.

A rule matches a group of primitive nodes and replaces them by one node of a `FusedOp` (or two, where one
kernel cannot do it all), whose name is the launcher's (`kernels.<value>`). Where a rule's preconditions
fail (gate and up of different types, q and k of a layer normed differently, ...), the nodes stay as they
are and run as the primitive kernels: a new architecture runs on the GPU at once and gets faster when a
rule matches it.

Pure functions of the graph and the weights' GGML types, without the kernels: the backend lowers with
them (CudaBackend.lower), and `minfer graph --backend cuda` and the tests run them on any machine.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterator
from typing import Any

from minfer.graph.ir import Graph, Node, Op, Tensor

WeightType = Callable[[str], int]  # a loaded weight's name -> its GGML type id


class FusedOp(enum.Enum):
    """One kernel each, for what several primitive ops do; each is exactly the composition its comment
    spells out. `node.params["args"]` names each input by the launcher parameter it becomes."""

    GEMV = "gemv"  # one token: matmul(rms_norm(x, g) or x, W) (+ the residual r, in place into r)
    GEMV_SWIGLU = "gemv_swiglu"  # one token: silu(matmul(h, Wgate)) * matmul(h, Wup), h = rms_norm(x, g)
    GEMV_GEGLU = "gemv_geglu"  # one token: gelu(matmul(h, Wgate)) * matmul(h, Wup), h = rms_norm(x, g)
    GEMV_QKV_ROPE_STORE = "gemv_qkv_rope_store"  # one token: h = rms_norm(x, g); q, k, v = h Wq/Wk/Wv (+ b);
    #                                              rope on q and k (none: rope_dim 0); kv_store of k and v; q out
    ATTENTION_DECODE = "attention_decode_f32"  # one token: attention of rope(rms_norm(q, q_norm)) per head over the
    #                                            cache, whose row at positions[0] gets the same of k (k_norm) first
    SWIGLU_F32 = "swiglu_f32"  # silu(gate) * up, in place into gate
    GEGLU_F32 = "geglu_f32"  # gelu(gate) * up, in place into gate
    RMS_NORM_ADD_F32 = "rms_norm_add_f32"  # y + rms_norm(x, g), in place into y (Gemma's post-block norms)
    GEMM = "gemm"  # a prompt's tensor-core matmul(x, W) (+ b) (+ the residual r, in place into r): r + (x W + b)
    GEMM_GROUP = "gemm_group"  # up to GEMM_GROUP_PARTS tensor-core matmuls of one x (+ b_p each), one launch
    GEMM_SWIGLU = "gemm_swiglu"  # a prompt's silu(matmul(x, Wgate)) * matmul(x, Wup), on the tensor cores
    GEMM_GEGLU = "gemm_geglu"  # a prompt's gelu(matmul(x, Wgate)) * matmul(x, Wup), on the tensor cores


# From this many tokens on, a matmul runs the tensor-core GEMM instead of the matmul kernel. Measured on
# the H200 (Q4_0, docs/PERFORMANCE.md): at 16 tokens gemm takes 18 us for ffn_up (matmul 81) and ties on
# ffn_down (86 vs 84); at 8 tokens matmul still wins ffn_down (45 vs 86), whose long rows suit its per-row
# dot products better than gemm's few, mostly empty 64-token tiles.
GEMM_MIN_TOKENS = 16
GEMM_K_STEP = 32  # gemm's step along in_features (gemm.cu): in_features must be a multiple of it
GEMM_GROUP_PARTS = 3  # products of one x that kernels.gemm_group computes in one launch
GEMV_VALUES_PER_LANE = 8  # gemv.cu's VALUES_PER_LANE: the one-token kernels read rows of a multiple of it


def matmul_kernel(node: Node) -> str:
    """The launcher that runs a MATMUL node: `gemv` for one token, `gemm` (tensor cores) for a prompt's
    product, `matmul` for the few tokens between, or rows gemm and gemv cannot walk."""
    x, weight = node.inputs
    n_tokens, in_features = x.shape[0], weight.shape[1]
    if n_tokens == 1 and in_features % GEMV_VALUES_PER_LANE == 0:
        return "gemv"
    if n_tokens >= GEMM_MIN_TOKENS and in_features % GEMM_K_STEP == 0:
        return "gemm"
    return "matmul"


def fuse(graph: Graph, weight_type: WeightType) -> Graph:
    """`graph` with every group of nodes a rule matches replaced by its fused node, the rules in order."""
    nodes = drop_single_last_row(graph)
    rules = (fuse_qkv_rope_store, fuse_gate_up, fuse_gemv, fuse_gated, fuse_norm_add, fuse_gemm_groups,
             fuse_gemm_epilogues, fuse_gemm_gated)  # fmt: skip
    for rule in rules:
        rewrite = Rewrite(nodes, {t.name for t in graph.outputs.values()})
        rule(rewrite, weight_type)
        nodes = rewrite.result()
    return Graph(graph.n_tokens, nodes, graph.inputs, graph.outputs, graph.constants)


class Rewrite:
    """One rule's pass over a graph's nodes: the lookups a rule needs, and `replace` to apply a match."""

    def __init__(self, nodes: list[Node], graph_outputs: set[str]) -> None:
        self.nodes = nodes
        self.graph_outputs = graph_outputs
        self.readers: dict[str, list[Node]] = {}
        self.producers: dict[str, Node] = {}
        for node in nodes:
            for tensor in node.inputs:
                self.readers.setdefault(tensor.name, []).append(node)
            self.producers |= {tensor.name: node for tensor in node.outputs}
        self.index = {id(node): i for i, node in enumerate(nodes)}
        self.replaced: dict[int, tuple[Node, ...]] = {}  # node index -> the fused nodes there (its last member) or ()

    def sole_reader(self, tensor: Tensor, op: enum.Enum) -> Node | None:
        """The one node reading `tensor`, if it is of `op` and no rule took it yet."""
        readers = self.readers.get(tensor.name, [])
        if len(readers) == 1 and readers[0].op is op and self.index[id(readers[0])] not in self.replaced:
            return readers[0]
        return None

    def bias_add(self, tensor: Tensor) -> Node | None:
        """The add_bias in place on `tensor`, its sole reader, of a bias as long as its rows."""
        add = self.sole_reader(tensor, Op.ADD_BIAS)
        if add is not None and add.inplace_input == 0 and add.inputs[1].shape == tensor.shape[-1:]:
            return add
        return None

    def residual_add(self, tensor: Tensor) -> Node | None:
        """The add of `tensor` into the residual stream, its sole reader: in place into the other operand, of
        `tensor`'s shape."""
        add = self.sole_reader(tensor, Op.ADD)
        if add is None:
            return None
        residual = add.inputs[add.inplace_input]
        if add.inputs[1 - add.inplace_input].name != tensor.name or residual.shape != tensor.shape:
            return None
        return add

    def projection_chain(self, matmul: Node) -> list[Node]:
        """The matmul, then its add_bias (bias_add), an rms_norm (Qwen3's and Gemma 3's per-head q_norm and k_norm)
        and its rope in place, each where it is the sole reader of the last."""
        chain = [matmul]
        bias = self.bias_add(matmul.output)
        if bias is not None:
            chain.append(bias)
        for op in (Op.RMS_NORM, Op.ROPE):
            follower = self.sole_reader(chain[-1].output, op)
            if follower is not None and (op is Op.RMS_NORM or follower.inplace_input == 0):
                chain.append(follower)
        return chain

    def norm_fanouts(self, n_matmuls: int) -> Iterator[tuple[Node, list[Node]]]:
        """Each one-token rms_norm read by exactly `n_matmuls` matmuls that the one-token kernels can run."""
        for norm in self.nodes:
            if not is_row_norm(norm) or norm.output.shape[0] != 1:
                continue
            matmuls = self.readers.get(norm.output.name, [])
            if len(matmuls) == n_matmuls and all(m.op is Op.MATMUL and gemv_reads(m.inputs[1]) for m in matmuls):
                yield norm, matmuls

    def replace(self, members: list[Node], op: FusedOp, inputs: list[Tensor], output: Tensor, args: tuple[str, ...],
                **fields: Any) -> None:  # fmt: skip
        """Put a node of `op` (its `params`, `inplace_input`, `writes`, `more_outputs` in `fields`) where the last
        of `members` was and drop the others, if that keeps the graph's order (`replace_by`)."""
        self.replace_by(members, [fused_node(members, op, inputs, output, args, **fields)])

    def replace_by(self, members: list[Node], fused: list[Node]) -> None:
        """Put the `fused` nodes, in order, where the last of `members` was and drop the others, if that keeps
        the graph's order: no value of a member but a fused node's is read elsewhere, nothing reads a value
        of the fused nodes before their place, and no node in between touches a state they write."""
        indices = sorted(self.index[id(node)] for node in members)
        inside = {id(node) for node in members}
        kept = {t.name for node in fused for t in node.outputs}
        if any(i in self.replaced for i in indices):
            return
        for value in (t.name for node in members for t in node.outputs):
            outside = [self.index[id(r)] for r in self.readers.get(value, []) if id(r) not in inside]
            if value not in kept and (outside or value in self.graph_outputs):
                return
            if any(i < indices[-1] for i in outside):
                return
        written = {t.name for node in fused for t in node.writes}
        for node in self.nodes[indices[0] : indices[-1]]:
            if id(node) not in inside and written & {t.name for t in [*node.inputs, *node.writes]}:
                return
        self.replaced |= dict.fromkeys(indices[:-1], ()) | {indices[-1]: tuple(fused)}

    def result(self) -> list[Node]:
        return [fused for i, node in enumerate(self.nodes) for fused in self.replaced.get(i, (node,))]


def fused_node(members: list[Node], op: FusedOp, inputs: list[Tensor], output: Tensor, args: tuple[str, ...],
               **fields: Any) -> Node:  # fmt: skip
    """The node of `op` that does what `members` do, named after them, its inputs named by `args`."""
    params = {"args": args, **fields.pop("params", {})}
    return Node(fused_name(members), op, inputs, output, params, **fields)


def fused_name(members: list[Node]) -> str:
    """`blk.0.attn_norm+attn_q+attn_k`: the members' names, their shared `blk.N.` said once."""
    prefix = members[0].name.rsplit(".", 1)[0] + "." if "." in members[0].name else ""
    if not all(node.name.startswith(prefix) for node in members):
        prefix = ""
    return prefix + "+".join(node.name[len(prefix) :] for node in members)


def is_row_norm(node: Node | None) -> bool:
    """An rms_norm over whole rows (the one-token kernels' fused norm), not one over each head of a row."""
    return node is not None and node.op is Op.RMS_NORM and node.inputs[1].shape[0] == node.output.shape[-1]


def gemv_reads(weight: Tensor) -> bool:
    return weight.shape[1] % GEMV_VALUES_PER_LANE == 0


def drop_single_last_row(graph: Graph) -> list[Node]:
    """LAST_ROW of a one-row tensor is that tensor: its readers read the input instead."""
    renamed: dict[str, Tensor] = {}
    nodes = []
    for node in graph.nodes:
        inputs = [renamed.get(t.name, t) for t in node.inputs]
        if node.op is Op.LAST_ROW and inputs[0].shape[0] == 1 and node.output.name not in graph.outputs:
            renamed[node.output.name] = inputs[0]
            continue
        nodes.append(node if inputs == node.inputs else dataclasses.replace(node, inputs=inputs))
    return nodes


def fuse_qkv_rope_store(g: Rewrite, weight_type: WeightType) -> None:
    """rms_norm -> three matmuls (-> add_bias each) (-> rms_norm of each head of q and k) -> rope on q and k
    -> kv_store of k and v, one token.

    Where q and k are normed per head before their rope (Qwen3, Gemma 3), and the attention reading q is the
    rope's only reader, two nodes: gemv_qkv_rope_store rotating nothing (a pair in its epilogue cannot see its
    whole head), then the attention as attention_decode_f32 norming and rotating q, and k in the cache row it
    was stored in, itself (one launch fewer than a kernel of its own between them)."""
    for norm, matmuls in g.norm_fanouts(3):
        chains = {chain[-1].output.name: chain for chain in map(g.projection_chain, matmuls)}
        store = next((r for chain in chains.values() for r in g.readers.get(chain[-1].output.name, [])
                      if r.op is Op.KV_STORE), None)  # fmt: skip
        k_end, v_end = (store.inputs[0].name, store.inputs[1].name) if store is not None else ("", "")
        if k_end == v_end or k_end not in chains or v_end not in chains:
            continue
        k_chain, v_chain = chains.pop(k_end), chains.pop(v_end)
        (q_chain,) = chains.values()
        q_rope, k_rope = q_chain[-1], k_chain[-1]
        if q_rope.op is not Op.ROPE or k_rope.op is not Op.ROPE or v_chain[-1].op in (Op.ROPE, Op.RMS_NORM):
            continue
        rope = {key: value for key, value in q_rope.params.items() if key != "n_heads"}
        same_rope = rope == {key: value for key, value in k_rope.params.items() if key != "n_heads"}
        positions, inv_freq = q_rope.inputs[1:]
        if not same_rope or [t.name for t in k_rope.inputs[1:]] != [positions.name, inv_freq.name]:
            continue
        if positions.name != store.inputs[2].name:
            continue
        parts = (q_chain, k_chain, v_chain)
        biases = [chain[1].inputs[1] for chain in parts if len(chain) > 1 and chain[1].op is Op.ADD_BIAS]
        weights = [chain[0].inputs[1] for chain in parts]
        heads = (q_rope.params["n_heads"], k_rope.params["n_heads"], k_rope.params["n_heads"])
        if len(biases) not in (0, 3) or [w.shape[0] for w in weights] != [n * rope["head_dim"] for n in heads]:
            continue
        bias_args = ("bq", "bk", "bv")[: len(biases)]
        qkv = dict(eps=norm.params["eps"], n_heads=heads[0], n_kv_heads=heads[1])
        q_norm, k_norm = (chain[-2] if chain[-2].op is Op.RMS_NORM else None for chain in (q_chain, k_chain))
        if q_norm is None and k_norm is None:
            g.replace(
                [norm, *q_chain, *k_chain, *v_chain, store], FusedOp.GEMV_QKV_ROPE_STORE,
                [*norm.inputs, *weights, positions, inv_freq, *biases], q_rope.output,
                ("x", "norm_weight", "wq", "wk", "wv", "positions", "inv_freq", *bias_args),
                params=qkv | rope, writes=store.writes,
            )  # fmt: skip
            continue
        if q_norm is None or k_norm is None or q_norm.params["eps"] != k_norm.params["eps"]:
            continue
        # Weights one head long: norms of each head (where there is one KV head, as in Gemma 3 270M, k's is
        # its row's norm too).
        if [n.inputs[1].shape[0] for n in (q_norm, k_norm)] != [rope["head_dim"]] * 2:
            continue
        # The attention of this step's q over the caches the store wrote, at the store's positions.
        attention = g.sole_reader(q_rope.output, Op.ATTENTION)
        if attention is None or [t.name for t in attention.inputs[1:4]] != [*(t.name for t in store.writes),
                                                                           positions.name]:  # fmt: skip
            continue
        projections = [norm, *q_chain[:-2], *k_chain[:-2], *v_chain, store]
        head_norms = [q_norm, q_rope, k_norm, k_rope, attention]
        g.replace_by([*projections, *head_norms], [
            fused_node(
                projections, FusedOp.GEMV_QKV_ROPE_STORE, [*norm.inputs, *weights, positions, *biases],
                q_norm.inputs[0], ("x", "norm_weight", "wq", "wk", "wv", "positions", *bias_args),
                params=qkv | rope | {"rope_dim": 0}, writes=store.writes,
            ),
            fused_node(
                head_norms, FusedOp.ATTENTION_DECODE,
                [q_norm.inputs[0], *attention.inputs[1:], q_norm.inputs[1], k_norm.inputs[1], inv_freq],
                attention.output, ("q", "k_cache", "v_cache", "positions", "kv_len", "q_norm", "k_norm", "inv_freq"),
                params=attention.params | rope | {"eps": q_norm.params["eps"]}, writes=store.writes[:1],
            ),
        ])  # fmt: skip


GATED = {Op.SILU: FusedOp.GEMV_SWIGLU, Op.GELU: FusedOp.GEMV_GEGLU}  # a gate's activation -> its gate/up kernel


def fuse_gate_up(g: Rewrite, weight_type: WeightType) -> None:
    """rms_norm -> two matmuls of one GGML type -> silu (or gelu) of one, times the other; one token."""
    for norm, matmuls in g.norm_fanouts(2):
        for gate, up in (matmuls, matmuls[::-1]):
            activation = next(filter(None, (g.sole_reader(gate.output, op) for op in GATED)), None)
            mul = g.sole_reader(activation.output, Op.MUL) if activation is not None else None
            if mul is None or mul.inplace_input != 0 or mul.inputs[1].name != up.output.name:
                continue
            if weight_type(gate.inputs[1].name) == weight_type(up.inputs[1].name):  # the kernel reads one format
                g.replace([norm, gate, up, activation, mul], GATED[activation.op],
                          [*norm.inputs, gate.inputs[1], up.inputs[1]], mul.output,
                          ("x", "norm_weight", "gate", "up"), params={"eps": norm.params["eps"]})  # fmt: skip


def fuse_gemv(g: Rewrite, weight_type: WeightType) -> None:
    """A one-token matmul with the rms_norm before it and the residual add after it, where they are the
    only reader of the value between: one gemv (a matmul with neither stays a MATMUL)."""
    for matmul in g.nodes:
        if matmul.op is not Op.MATMUL or matmul.output.shape[0] != 1 or not gemv_reads(matmul.inputs[1]):
            continue
        x, weight = matmul.inputs
        members, inputs, args, fields = [matmul], [x, weight], ["x", "weight"], {}
        norm = g.producers.get(x.name)
        if is_row_norm(norm) and g.sole_reader(x, Op.MATMUL) is matmul:
            members.insert(0, norm)
            inputs = [norm.inputs[0], weight, norm.inputs[1]]
            args.append("norm_weight")
            fields["params"] = {"eps": norm.params["eps"]}
        output = matmul.output
        add = g.residual_add(matmul.output)
        if add is not None:
            members.append(add)
            inputs.append(add.inputs[add.inplace_input])
            args.append("residual")
            output, fields["inplace_input"] = add.output, len(inputs) - 1
        if len(members) > 1:
            g.replace(members, FusedOp.GEMV, inputs, output, tuple(args), **fields)


ELEMENTWISE_GATED = {Op.SILU: FusedOp.SWIGLU_F32, Op.GELU: FusedOp.GEGLU_F32}  # a gate's activation -> its kernel


def fuse_gated(g: Rewrite, weight_type: WeightType) -> None:
    """silu (or gelu) of the gate, times up, in place into the gate: one elementwise kernel."""
    for activation in g.nodes:
        fused = ELEMENTWISE_GATED.get(activation.op)
        mul = g.sole_reader(activation.output, Op.MUL) if fused is not None else None
        if mul is not None and mul.inplace_input == 0:
            g.replace([activation, mul], fused, [activation.inputs[0], mul.inputs[1]], mul.output, ("gate", "up"),
                      inplace_input=0)  # fmt: skip


def fuse_norm_add(g: Rewrite, weight_type: WeightType) -> None:
    """A row norm whose only reader adds it into the residual (Gemma's post_attention_norm and post_ffw_norm):
    one kernel that norms x and adds it into y in place."""
    for norm in g.nodes:
        add = g.sole_reader(norm.output, Op.ADD) if is_row_norm(norm) else None
        if add is not None and add.inputs[1 - add.inplace_input].name == norm.output.name:
            x, weight = norm.inputs
            g.replace([norm, add], FusedOp.RMS_NORM_ADD_F32, [x, weight, add.inputs[add.inplace_input]], add.output,
                      ("x", "weight", "y"), inplace_input=2, params={"eps": norm.params["eps"]})  # fmt: skip


def fuse_gemm_groups(g: Rewrite, weight_type: WeightType) -> None:
    """Runs of consecutive tensor-core matmuls that read the same x with weights of one type and row length,
    up to GEMM_GROUP_PARTS long: one gemm_group launch computes a run, so a layer's narrow q, k and v
    products share the GPU instead of following each other. The group node makes every product of the run
    (its outputs, in order)."""

    def on_tensor_cores(node: Node | None) -> bool:
        return node is not None and node.op is Op.MATMUL and matmul_kernel(node) == "gemm"

    def joins(run: list[Node], node: Node) -> bool:
        x, weight = run[0].inputs
        return (
            len(run) < GEMM_GROUP_PARTS
            and node.inputs[0].name == x.name
            and node.inputs[1].shape[1] == weight.shape[1]
            and weight_type(node.inputs[1].name) == weight_type(weight.name)
        )

    run: list[Node] = []
    for node in [*g.nodes, None]:
        if on_tensor_cores(node) and run and joins(run, node):
            run.append(node)
            continue
        if len(run) > 1:
            g.replace(run, FusedOp.GEMM_GROUP, [run[0].inputs[0], *(m.inputs[1] for m in run)], run[0].output,
                      ("x", *(f"weight_{part}" for part in range(len(run)))),
                      more_outputs=[m.output for m in run[1:]])  # fmt: skip
        run = [node] if on_tensor_cores(node) else []


def fuse_gemm_epilogues(g: Rewrite, weight_type: WeightType) -> None:
    """A prompt's tensor-core products with the adds after them, which the GEMM's epilogue makes as it stores y:
    each product's add_bias in place on it (Qwen2's q, k and v: bias_add), and after a lone product the add into
    the residual (attn_output and ffn_down: residual_add), y = r + (x W + b), the unfused order. A group keeps its
    op and takes each part's bias; a lone matmul with either becomes a gemm node, in place into the residual."""
    for node in g.nodes:
        lone = node.op is Op.MATMUL and matmul_kernel(node) == "gemm"
        if node.op is not FusedOp.GEMM_GROUP and not lone:
            continue
        members, outputs, biases, bias_args = [node], [], [], []
        for part, product in enumerate(node.outputs):
            add = g.bias_add(product)
            if add is not None:
                members.append(add)
                biases.append(add.inputs[1])
                bias_args.append("bias" if lone else f"bias_{part}")
            outputs.append(add.output if add is not None else product)
        if not lone:
            if biases:
                g.replace(members, FusedOp.GEMM_GROUP, [*node.inputs, *biases], outputs[0],
                          (*node.params["args"], *bias_args), more_outputs=outputs[1:])  # fmt: skip
            continue
        inputs, args, fields = [*node.inputs, *biases], ["x", "weight", *bias_args], {}
        add = g.residual_add(outputs[0])
        if add is not None:
            members.append(add)
            inputs.append(add.inputs[add.inplace_input])
            args.append("residual")
            outputs[0], fields["inplace_input"] = add.output, len(inputs) - 1
        if len(members) > 1:
            g.replace(members, FusedOp.GEMM, inputs, outputs[0], tuple(args), **fields)


GEMM_GATED = {FusedOp.SWIGLU_F32: FusedOp.GEMM_SWIGLU, FusedOp.GEGLU_F32: FusedOp.GEMM_GEGLU}  # kernel -> GEMM's


def fuse_gemm_gated(g: Rewrite, weight_type: WeightType) -> None:
    """A prompt's gate|up group (two parts, no bias) whose products only swiglu_f32 (geglu_f32) reads: one
    gemm_swiglu (gemm_geglu), whose tiles hold each feature's gate and up rows side by side, so the gated
    activation is its epilogue and neither product is ever stored."""
    for group in g.nodes:
        if group.op is not FusedOp.GEMM_GROUP or group.params["args"] != ("x", "weight_0", "weight_1"):
            continue
        gated = next(filter(None, (g.sole_reader(group.outputs[0], op) for op in GEMM_GATED)), None)
        if gated is None or g.sole_reader(group.outputs[1], gated.op) is not gated:
            continue
        weights = dict(zip((t.name for t in group.outputs), group.inputs[1:], strict=True))
        gate, up = (weights[t.name] for t in gated.inputs)
        g.replace([group, gated], GEMM_GATED[gated.op], [group.inputs[0], gate, up], gated.output,
                  ("x", "gate", "up"))  # fmt: skip
