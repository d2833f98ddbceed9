"""`nmt serve`: its options, checked against `nmt.limits.RANGES` with the flags named, then
the server (`nmt.serve`). FastAPI and torch are imported inside, so `nmt --help` answers at
once.
"""

from __future__ import annotations

import math
from typing import Annotated

import typer

from nmt.cli_shared import (
    DeviceOpt,
    Int8Opt,
    ModelOpt,
    PrecisionOpt,
    load_translator,
    user_errors,
)
from nmt.errors import NmtError
from nmt.limits import RANGES, Limits


def serve(
    model: ModelOpt = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on; 0.0.0.0 opens it to the network.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port; 0 picks a free one.")] = 8080,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = "fp32",
    int8: Int8Opt = False,
    max_batch: Annotated[
        int,
        typer.Option(
            "--max-batch",
            help="Sentences of concurrent requests decoded together (1: one request at a time).",
        ),
    ] = Limits.batch_sentences,
    batch_wait_ms: Annotated[
        float, typer.Option("--batch-wait-ms", help="How long a request waits for others.")
    ] = Limits.batch_wait_ms,
    max_sentences: Annotated[
        int, typer.Option("--max-sentences", help="Sentences in one request.")
    ] = Limits.max_sentences,
    max_chars: Annotated[
        int, typer.Option("--max-chars", help="Characters in one sentence.")
    ] = Limits.max_chars,
    max_beam: Annotated[
        int, typer.Option("--max-beam", help="Largest beam a request may ask for.")
    ] = Limits.max_beam,
    max_queue: Annotated[
        int, typer.Option("--max-queue", help="Requests waiting to be decoded; 503 beyond.")
    ] = Limits.max_queue,
    max_connections: Annotated[
        int, typer.Option("--max-connections", help="Connections open at once; 503 beyond.")
    ] = Limits.max_connections,
    request_timeout: Annotated[
        float,
        typer.Option("--request-timeout", help="Seconds a request may wait and decode; 503 after."),
    ] = Limits.request_seconds,
    header_timeout: Annotated[
        float,
        typer.Option("--header-timeout", help="Seconds for a request's headers; closed after."),
    ] = Limits.header_seconds,
    body_timeout: Annotated[
        float, typer.Option("--body-timeout", help="Seconds for a request's body; 408 after.")
    ] = Limits.body_seconds,
    log_level: Annotated[
        str,
        typer.Option("--log-level", help="uvicorn's: debug, info (a line a request), warning."),
    ] = "info",
) -> None:
    """Serve a model over HTTP: POST /translate, GET /health, /info, /docs, and a page at /;
    LibreTranslate's API under /libretranslate/ for its clients.

    Concurrent requests are decoded together; each gets what it would have got alone.
    SIGTERM or Ctrl-C answers the requests under way, then exits.

    Example:
        nmt serve --model runs/latest
        curl -s localhost:8080/translate -d '{"text": "A dog runs."}'
    """

    with user_errors():
        from nmt.serve import ServeOptions
        from nmt.serve import serve as run_server

        for flag, key, value in (
            ("--max-batch", "batch_sentences", max_batch),
            ("--batch-wait-ms", "batch_wait_ms", batch_wait_ms),
            ("--max-sentences", "max_sentences", max_sentences),
            ("--max-chars", "max_chars", max_chars),
            ("--max-beam", "max_beam", max_beam),
            ("--max-queue", "max_queue", max_queue),
            ("--max-connections", "max_connections", max_connections),
            ("--request-timeout", "request_seconds", request_timeout),
            ("--header-timeout", "header_seconds", header_timeout),
            ("--body-timeout", "body_seconds", body_timeout),
        ):
            least, most = RANGES[key]
            if not math.isfinite(value) or not least <= value <= most:  # inf/nan: no answer
                raise NmtError(f"{flag} {value}: expected a finite number from {least} to {most}")
        if not 0 <= port <= 65535:
            raise NmtError(f"--port {port}: expected 0 to 65535")
        levels = ("critical", "error", "warning", "info", "debug", "trace")
        if log_level.lower() not in levels:
            raise NmtError(f"--log-level {log_level!r}: expected one of {', '.join(levels)}")
        limits = Limits(
            batch_sentences=max_batch,
            batch_wait_ms=batch_wait_ms,
            max_sentences=max_sentences,
            max_chars=max_chars,
            max_beam=max_beam,
            max_queue=max_queue,
            max_connections=max_connections,
            request_seconds=request_timeout,
            header_seconds=header_timeout,
            body_seconds=body_timeout,
        )
        translator = load_translator(model, device, precision, int8=int8)
        run_server(
            translator, ServeOptions(host=host, port=port, limits=limits, log_level=log_level)
        )
