"""A bounded load test of `minfer serve`: it starts the server itself, drives it, stops it, prints a markdown table.

    python tools/load_test.py [MODEL] [--backend cpu] [--clients 1,4,16] [--requests 4] [--max-tokens 32]

The server runs on 127.0.0.1 on a free port with a queue as deep as the most clients, so that no request is
refused for a full queue. At each level, that many clients each send `--requests` streaming chat requests one after
the other (greedy, `--max-tokens` each, a few different prompts). Per level the table has the requests per second,
the time to first token (p50 and p95: from sending the request to its first piece of text, queueing included) and
the generated tokens per second of the whole level (the server runs one generation at a time, so this is the
engine's throughput under that load). The server is stopped with SIGTERM at the end, also after a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import httpx

from minfer.options import positive_int

PROMPTS = [
    "Tell me about the history of the printing press.",
    "Explain how a bicycle stays upright.",
    "Write a short poem about the sea.",
    "What are the main causes of the seasons?",
]
START_SECONDS = 120  # loading a model on the CPU takes a few seconds; a large one on a slow disk, longer


@dataclass
class Result:
    ttft: float  # seconds from sending to the first piece of text
    tokens: int  # completion tokens, from the usage chunk


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of `values` (not empty)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def start_server(args: argparse.Namespace, queue_size: int) -> tuple[subprocess.Popen[str], str]:
    """`minfer serve` on a free port; its URL, read from its "listening on" line."""
    command = [sys.executable, "-m", "minfer.cli", "serve", *([args.model] if args.model else []),
               "--backend", args.backend, "--port", "0", "--queue-size", str(queue_size)]  # fmt: skip
    if args.threads is not None:
        command += ["--threads", str(args.threads)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(server.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout=START_SECONDS)
    if not lines or not lines[0].startswith("minfer serve: listening on "):
        server.kill()
        raise SystemExit(f"load_test: the server did not start within {START_SECONDS} s: {' '.join(command)}")
    return server, lines[0].split()[-1]


async def one_request(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> Result:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    sent = time.monotonic()
    ttft, tokens = None, None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"status {response.status_code}: {(await response.aread()).decode()}")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if "error" in chunk:
                raise RuntimeError(f"the stream ended with an error: {chunk['error']['message']}")
            if ttft is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                ttft = time.monotonic() - sent
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if ttft is None or tokens is None:
        raise RuntimeError("the stream ended without text or without its usage chunk")
    return Result(ttft, tokens)


async def run_level(url: str, clients: int, requests: int, max_tokens: int) -> tuple[list[Result], float]:
    """`clients` clients sending `requests` requests each; the results and the level's wall time."""

    async def client_loop(index: int) -> list[Result]:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            return [await one_request(client, PROMPTS[(index + i) % len(PROMPTS)], max_tokens)
                    for i in range(requests)]  # fmt: skip

    started = time.monotonic()
    per_client = await asyncio.gather(*(client_loop(index) for index in range(clients)))
    return [result for results in per_client for result in results], time.monotonic() - started


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of client counts: {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"client counts must be positive, got {text!r}")
    return levels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", help="a known name or a .gguf file (default: the default model)")
    parser.add_argument("--backend", default="cpu", help="minfer serve's --backend (default: cpu)")
    parser.add_argument("--threads", type=positive_int, help="minfer serve's --threads")
    parser.add_argument("--clients", type=parse_levels, default=[1, 4, 16], help="concurrency levels, a,b,c")
    parser.add_argument("--requests", type=positive_int, default=4, help="requests per client at each level")
    parser.add_argument("--max-tokens", type=positive_int, default=32, help="max_tokens of each request")
    args = parser.parse_args()
    server, url = start_server(args, queue_size=max(args.clients))
    try:
        rows = []
        for clients in args.clients:
            results, seconds = asyncio.run(run_level(url, clients, args.requests, args.max_tokens))
            ttfts = [result.ttft for result in results]
            rows.append(
                f"| {clients} | {len(results)} | {len(results) / seconds:.2f} | {percentile(ttfts, 0.5) * 1000:.0f} "
                f"| {percentile(ttfts, 0.95) * 1000:.0f} | {sum(r.tokens for r in results) / seconds:.1f} |"
            )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    print(f"{args.model or 'default model'}, backend {args.backend}, max_tokens {args.max_tokens}\n")
    print("| clients | requests | requests/s | TTFT p50 (ms) | TTFT p95 (ms) | tokens/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
