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
    batch_wait_ms: float = 5.0  # how long a lone request waits for company
