"""Payload fetch over libp2p (Noise, /verinfer/payload/1) vs HTTP (aiohttp) on loopback.

Payloads are real executer payload JSON for synthetic 256- and 4096-token artifacts (K = 5, the
SmolLM2 vocabulary). Latency is the median of N sequential fetches on a warm connection, from the
asyncio loop as the daemon fetches; throughput is MB/s of payload bytes. The "libp2p" rows serve from
a host in the same process (two trio threads sharing one GIL); the "another process" row serves from
a separate process, as a real peer does. Prints a table and writes JSON (default
bench-results/bench_p2p.json).
Usage: python scripts/bench_p2p.py [--fetches 50] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web
from rich.console import Console
from rich.table import Table

from chain.devnet import find_free_port
from node.executer.api import InferencePayload
from node.executer.synthetic import SyntheticRequest, make_synthetic_artifact
from node.p2p.host import P2PHost
from node.protocol.artifact import encode_artifact_wire
from node.protocol.sampler import SamplingParams


def payload_bytes(tokens: int) -> bytes:
    """Return a payload JSON like an executer serves for a `tokens`-long artifact."""
    request = SyntheticRequest(inference_id=1, user_seed=1, params=SamplingParams(1.0), vocab_size=49_152,
                               output_length=tokens)
    artifact = make_synthetic_artifact(request, 1)
    proofs = [base64.b64encode(b"\x00" * 258).decode()] * (1 + tokens // 32)
    return InferencePayload(model="m", model_id="0x" + "11" * 32, inference_id="1", user_seed="1",
                            request={"messages": [{"role": "user", "content": "hi"}]},
                            artifact=base64.b64encode(encode_artifact_wire(artifact)).decode(),
                            verification_proofs=proofs).model_dump_json().encode()


async def time_http(url: str, n: int) -> list[float]:
    out = []
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            start = time.perf_counter()
            async with session.get(url) as r:
                await r.read()
            out.append(time.perf_counter() - start)
    return out


async def time_p2p(host: P2PHost, addr: str, iid: int, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        await host.fetch_payload(addr, iid)
        out.append(time.perf_counter() - start)
    return out


async def run(fetches: int) -> dict[str, dict[str, float]]:
    payloads = {256: payload_bytes(256), 4096: payload_bytes(4096)}
    app = web.Application()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=payloads[int(request.match_info["n"])], content_type="application/json")

    app.add_routes([web.get("/v1/payloads/{n}", handler)])
    runner = web.AppRunner(app)
    await runner.setup()
    port = find_free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = P2PHost(Path(tmp) / "s.key", payloads.get).start()
        client = P2PHost(Path(tmp) / "c.key").start()
        addr = server.addrs[0] if "/p2p/" in server.addrs[0] else f"{server.addrs[0]}/p2p/{server.peer_id}"
        await client.fetch_payload(addr, 256)  # connect once (the dial is measured separately below)
        for tokens, body in payloads.items():
            p2p = await time_p2p(client, addr, tokens, fetches)
            http = await time_http(f"http://127.0.0.1:{port}/v1/payloads/{tokens}", fetches)
            for name, times in (("libp2p", p2p), ("http", http)):
                median = statistics.median(times)
                results[f"{name} {tokens} tokens"] = {"bytes": len(body), "median_ms": median * 1e3,
                                                      "mb_per_s": len(body) / median / 1e6}
        other = subprocess.Popen([sys.executable, __file__, "--serve", tmp], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert other.stdout is not None
            other_addr = other.stdout.readline().strip()
            await client.fetch_payload(other_addr, 256)
            times = await time_p2p(client, other_addr, 256, fetches)
            median = statistics.median(times)
            results["libp2p 256 tokens, server in another process"] = {
                "bytes": len(payloads[256]), "median_ms": median * 1e3, "mb_per_s": len(payloads[256]) / median / 1e6}
        finally:
            other.kill()
        fresh = P2PHost(Path(tmp) / "f.key").start()
        start = time.perf_counter()
        await fresh.fetch_payload(addr, 256)
        results["libp2p first fetch (dial + Noise)"] = {"bytes": len(payloads[256]),
                                                        "median_ms": (time.perf_counter() - start) * 1e3,
                                                        "mb_per_s": 0.0}
        for h in (fresh, client, server):
            h.stop()
    await runner.cleanup()
    return results


def serve(key_dir: str) -> None:
    """Serve the 256-token payload from this process until stdin closes; print the address first."""
    with P2PHost(Path(key_dir) / "o.key", {256: payload_bytes(256)}.get) as host:
        print(host.addrs[0] if "/p2p/" in host.addrs[0] else f"{host.addrs[0]}/p2p/{host.peer_id}", flush=True)
        sys.stdin.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fetches", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("bench-results/bench_p2p.json"))
    parser.add_argument("--serve", metavar="KEY_DIR", help=argparse.SUPPRESS)  # the other process's role
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    results = asyncio.run(run(args.fetches))
    table = Table(title=f"payload fetch on loopback, median of {args.fetches}")
    for column in ("transport / payload", "bytes", "latency", "throughput"):
        table.add_column(column, justify="right")
    for name, r in results.items():
        table.add_row(name, f"{r['bytes']:,}", f"{r['median_ms']:.2f} ms",
                      f"{r['mb_per_s']:.1f} MB/s" if r["mb_per_s"] else "-")
    Console().print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "p2p", "machine": platform.machine(), "results": results},
                                   indent=2) + "\n")


if __name__ == "__main__":
    main()
