"""Load test for `nmt serve`: N concurrent clients for a bounded time against localhost.

Starts `nmt serve` twice on free localhost ports, one after the other: as it ships
(concurrent requests decoded together) and with `--max-batch 1` (one request at a time).
Each of `--clients` clients sends one sentence a request, the next as soon as the answer
came, for `--seconds`. Reports requests/s, sentences/s, p50/p99 latency and errors (any
non-200 answer or failed connection) for both, and the speed-up of batching.

    .venv/bin/python scripts/load_test.py --model runs/latest --clients 16 --seconds 30

With `--url`, a server already running is measured alone (no comparison).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from argtypes import above_zero, sentence_lines, whole

from nmt import signals
from nmt.errors import NmtError, one_line
from nmt.files import check_output, write_output

ROOT = Path(__file__).resolve().parents[1]
URL_LINE = re.compile(r"^nmt serve: (http://\S+) ")
DEFAULT_SENTENCES = ROOT.parent / "shared" / "data" / "multi30k" / "val.en"


@dataclass
class Served:
    url: str
    proc: subprocess.Popen[str]
    stderr_text: str = ""  # what the server wrote to stderr, once it has exited


@contextlib.contextmanager
def running_server(model: str, *args: str, timeout: float = 120) -> Iterator[Served]:
    """`nmt serve` on a free localhost port, once /health answers; stopped with SIGTERM
    afterwards, and checked to have exited cleanly."""
    cmd = [sys.executable, "-m", "nmt", "serve", "-m", model, "--port", "0"]
    with contextlib.ExitStack() as owned:
        with signals.held(block=False):  # a Ctrl-C while it starts: raised once it is owned
            proc = subprocess.Popen(
                [*cmd, "--log-level", "warning", *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            owned.callback(_ended, proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = URL_LINE.match(line)
        if match is None:  # its own one-line error (a bad --model), or what it printed
            said = (proc.communicate()[1].strip() or line.strip() or "no output").splitlines()
            raise NmtError(f"nmt serve did not start: {said[-1].removeprefix('error: ')}")
        url = match.group(1)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        served = Served(url, proc)
        yield served
        proc.send_signal(signal.SIGTERM)
        served.stderr_text = proc.communicate(timeout=60)[1]
        if proc.returncode != 0:
            raise RuntimeError(f"nmt serve exited with {proc.returncode}: {served.stderr_text}")


def _ended(proc: subprocess.Popen[str]) -> None:
    """`proc` killed (if still there) and waited for."""
    proc.kill()
    proc.wait()


@dataclass
class Load:
    """What the clients saw in one measurement."""

    mode: str
    clients: int
    seconds: float
    requests: int
    sentences: int
    errors: int
    requests_per_s: float
    sentences_per_s: float
    p50_ms: float
    p99_ms: float
    batches: int  # decoding calls the server made (GET /health)
    abandoned: int = 0  # requests the leaving clients gave up on (not errors)
    dropped: int = 0  # of those, never decoded by the server (GET /health)


async def _client(
    http: httpx.AsyncClient,
    url: str,
    sentences: list[str],
    rng: random.Random,
    stop_at: float,
    beam: int,
    per_request: int,
    latencies: list[float],
    failures: list[str],
    leaves: list[int] | None = None,
) -> None:
    """One client in a loop; with `leaves`, one that gives up on each request after a few
    milliseconds (its connection closed mid-request), counting them there."""
    while time.monotonic() < stop_at:
        body = {"text": rng.sample(sentences, per_request), "beam": beam}
        start = time.monotonic()
        if leaves is not None:
            with contextlib.suppress(httpx.HTTPError):
                await http.post(f"{url}/translate", json=body, timeout=0.005)
            leaves.append(1)
            await asyncio.sleep(0.02)
            continue
        try:
            r = await http.post(f"{url}/translate", json=body)
            if r.status_code != 200:
                failures.append(f"HTTP {r.status_code}: {r.text[:200]}")
                continue
        except httpx.HTTPError as e:
            failures.append(f"{type(e).__name__}: {e}")
            continue
        latencies.append(time.monotonic() - start)


async def measure(
    url: str,
    mode: str,
    sentences: list[str],
    *,
    clients: int,
    seconds: float,
    beam: int,
    per_request: int = 1,
    leaving: int = 0,
) -> Load:
    """`clients` clients in a loop for `seconds`, `per_request` random sentences a request;
    `leaving` more that disconnect in the middle of every request."""
    latencies: list[float] = []
    failures: list[str] = []
    leaves: list[int] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=120) as http:
        await http.post(f"{url}/translate", json={"text": sentences[0], "beam": beam})  # warm-up
        before = (await http.get(f"{url}/health")).json()
        start = time.monotonic()
        stop_at = start + seconds
        await asyncio.gather(
            *(
                _client(
                    http,
                    url,
                    sentences,
                    random.Random(i),
                    stop_at,
                    beam,
                    per_request,
                    latencies,
                    failures,
                    leaves if i >= clients else None,
                )
                for i in range(clients + leaving)
            )
        )
        elapsed = time.monotonic() - start
        await asyncio.sleep(1.0)  # the server's last abandoned requests reach the batcher
        after = (await http.get(f"{url}/health")).json()
        batches = after["batches"] - before["batches"]
    for failure in failures[:5]:
        print(f"{mode}: {failure}", file=sys.stderr)
    ms = sorted(1000 * x for x in latencies) or [float("nan")]
    return Load(
        mode=mode,
        clients=clients,
        seconds=round(elapsed, 2),
        requests=len(latencies),
        sentences=len(latencies) * per_request,
        errors=len(failures),
        requests_per_s=round(len(latencies) / elapsed, 2),
        sentences_per_s=round(len(latencies) * per_request / elapsed, 2),
        p50_ms=round(statistics.median(ms), 1),
        p99_ms=round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1),
        batches=batches,
        abandoned=len(leaves),
        dropped=after.get("dropped", 0) - before.get("dropped", 0),
    )


def table(loads: list[Load]) -> str:
    base = next((x for x in loads if x.mode == "one at a time"), None)
    lines = [
        "| server | requests/s | sentences/s | p50 ms | p99 ms | errors | batches | speed-up "
        "| abandoned (not decoded) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for x in loads:
        ratio = f"{x.requests_per_s / base.requests_per_s:.2f}x" if base else "-"
        left = f"{x.abandoned} ({x.dropped})" if x.abandoned else "-"
        lines.append(
            f"| {x.mode} | {x.requests_per_s:,.1f} | {x.sentences_per_s:,.1f} | {x.p50_ms:,.0f} "
            f"| {x.p99_ms:,.0f} | {x.errors} | {x.batches:,} | {ratio} | {left} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="runs/latest", help="run directory or checkpoint")
    ap.add_argument("--url", help="measure this running server alone")
    ap.add_argument("--clients", type=whole(1), default=16)
    ap.add_argument("--seconds", type=above_zero("seconds"), default=30.0)
    ap.add_argument("--beam", type=whole(1), default=5)
    ap.add_argument("--per-request", type=whole(1), default=1, help="sentences in each request")
    ap.add_argument("--sentences", type=Path, default=DEFAULT_SENTENCES, help="one a line")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", type=Path, help="write the figures as JSON")
    args = ap.parse_args()
    # before any server starts: a bad input, or an output that cannot be written
    sentences = [s for s in sentence_lines(args.sentences, "--sentences") if s.strip()]
    if args.out:
        check_output(args.out, "--out", [(args.sentences, "--sentences")])
    run = {
        "clients": args.clients,
        "seconds": args.seconds,
        "beam": args.beam,
        "per_request": args.per_request,
    }
    loads = []
    if args.url:
        try:  # one line where nothing answers as nmt serve does, not a client's traceback
            httpx.get(f"{args.url}/health", timeout=10).raise_for_status()
        except httpx.HTTPError as e:
            raise NmtError(f"--url {args.url}: no nmt server answers there ({e})") from None
        loads.append(asyncio.run(measure(args.url, "as running", sentences, **run)))
    else:
        for mode, extra in (("batched", []), ("one at a time", ["--max-batch", "1"])):
            with running_server(args.model, "--device", args.device, *extra) as server:
                loads.append(asyncio.run(measure(server.url, mode, sentences, **run)))
        # The same clients, and a third as many again that leave in the middle of every
        # request: a quarter of all the clients.
        with running_server(args.model, "--device", args.device) as server:
            mixed = measure(
                server.url, "batched, 1/4 leaving", sentences, leaving=args.clients // 3, **run
            )
            loads.append(asyncio.run(mixed))
    print(table(loads))
    if args.out:
        record = {"model": args.model, "sentences": str(args.sentences), **run}
        record["loads"] = [asdict(x) for x in loads]
        write_output(args.out, (json.dumps(record, indent=2) + "\n").encode("utf-8"))
    if any(x.errors for x in loads):
        sys.exit(1)


if __name__ == "__main__":
    with one_line():  # a bad input or output, a server that did not start
        main()
