"""The replay state machine, recorded (docs/tutorial/02-minimal-cuda.md, §2.4): greedy decode steps of a
model on the CUDA backend, and after each what the one-token graph's run was: eager (runs 1-2), captured
(run 3) or replayed (every later run, one graph launch).

    python docs/tutorial/toys/replay.py MODEL.gguf [--steps 6]

The state is the compiled graph's own (minfer/backends/cuda/backend.py: CudaCompiledGraph.run): how many
runs it has had and whether it holds a CudaGraph. Set MINFER_NO_CUDA_GRAPH=1 to see every run stay eager.
"""

from __future__ import annotations

import argparse
import sys
import time

import minfer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a GGUF file (e.g. the synthetic Qwen2.5-0.5B of run-on-gpu.sh)")
    parser.add_argument("--steps", type=int, default=6, help="decode steps to record (default 6)")
    args = parser.parse_args()
    with minfer.load(args.model, backend="cuda", ctx_size=512) as engine:
        prompt = [1, 2, 3, 4]
        token = engine.forward(prompt, 0).argmax("logits")
        for step in range(args.steps):
            start = time.perf_counter()
            program = engine.forward([token], len(prompt) + step)
            token = program.argmax("logits")  # the drain point: the 4-byte read-back syncs the stream
            host_ms = (time.perf_counter() - start) * 1000
            compiled = program.compiled
            graph = compiled.cuda_graph
            if graph is None:
                state = "eager: every node launched"
            elif compiled.runs == compiled.WARMUP_RUNS + 1:
                state = f"captured: {graph.node_count} kernels recorded, then launched as one graph"
            else:
                state = f"replayed: one launch of the {graph.node_count}-node graph"
            print(f"run {compiled.runs}: {state:58} {host_ms:7.2f} ms  token {token}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
