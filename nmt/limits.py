"""What one request to `nmt serve` may ask for, and how much one decoding call takes.

Apart from the server, so that `nmt serve`'s options take their defaults from here without
the command line importing the server's machinery (asyncio, FastAPI).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, and how much one decoding call takes."""

    max_body_bytes: int = 1 << 20  # 413 above
    max_sentences: int = 64  # sentences in one request
    max_chars: int = 1000  # characters in one sentence
    max_beam: int = 16
    batch_sentences: int = 64  # sentences decoded together; 1 = one request at a time
    batch_tokens: int = 4096  # source subwords decoded together
    batch_wait_ms: float = 5.0  # how long a lone request waits for company (0 to 1000)
    # Slow, vanished and too many clients.
    header_seconds: float = 10.0  # a request's headers must arrive within this, or closed
    body_seconds: float = 10.0  # and its body within this after them, or 408
    max_connections: int = 256  # open connections and requests at once; 503 beyond
    max_queue: int = 256  # requests waiting to be decoded; 503 with Retry-After beyond
    request_seconds: float = 60.0  # one request's wait and decoding; 503 beyond


# The ranges `nmt serve`'s numeric options accept: (least, most).
RANGES: dict[str, tuple[float, float]] = {
    "batch_sentences": (1, 4096),
    "batch_wait_ms": (0, 1000),
    "max_sentences": (1, 4096),
    "max_chars": (1, 100_000),
    "max_beam": (1, 256),
    "max_connections": (1, 100_000),
    "max_queue": (1, 100_000),
    "request_seconds": (0.1, 3600),
    "header_seconds": (0.1, 600),
    "body_seconds": (0.1, 600),
}
