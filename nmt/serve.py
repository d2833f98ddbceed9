"""`nmt serve`: a trained model behind an HTTP API (FastAPI under uvicorn) that decodes
concurrent requests together, and a page that shows a translation with its attention.

A request is read, parsed and checked on the event loop; its sentences go to the
`nmt.batcher.Batcher`, which decodes them with those of other requests that came within a
few milliseconds (up to a sentence and a token budget).

Nothing in a request names a file or a model: the server translates with the one model it
was started with. A request that fails is answered with a JSON `{"detail": "FIELD: why"}`
(400 unreadable JSON, 413 too large, 422 a field out of range) and the server goes on.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nmt.batcher import Batcher
from nmt.limits import Limits
from nmt.translate import Translation, Translator


class TranslateRequest(BaseModel):
    """The body of POST /translate."""

    model_config = ConfigDict(extra="forbid")

    text: str | list[str] = Field(description="A sentence, or a list of sentences.")
    beam: int | None = Field(None, ge=1, description="Beam size, 1 = greedy; default: the model's.")
    nbest: int = Field(1, ge=1, description="Translations returned per sentence, best first.")
    attention: bool = Field(False, description="Return each attention matrix.")


# ----------------------------------------------------------------------------- the app


def _fail(status: int, where: str, why: str) -> HTTPException:
    return HTTPException(status, detail=f"{where}: {why}")


def _problem(errors: Sequence[Any]) -> str:
    """Pydantic's most specific error as "FIELD: why", the field as a user wrote it:
    ("text", "list[str]", 3) -> "text[3]" (the middle part names a member of the type
    union, not a field)."""
    error = max(errors, key=lambda e: len(e["loc"]))  # the first of the deepest
    loc = error["loc"]
    names = [p for p in loc if isinstance(p, str) and p != "body"]
    field = (names[0] if names else "body") + "".join(f"[{p}]" for p in loc if isinstance(p, int))
    return f"{field}: {error['msg']}"


async def _read_json(request: Request, limit: int) -> Any:
    """The request body parsed as JSON, whatever its content type (`curl -d` sends JSON as
    form data), refused past `limit` bytes before more is read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _fail(413, "body", f"{int(declared):,} bytes; the limit is {limit:,}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _fail(413, "body", f"more than {limit:,} bytes; the limit is {limit:,}")
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(400, "body", f"not JSON ({e})") from None


def _check(req: TranslateRequest, limits: Limits, default_beam: int) -> tuple[list[str], int]:
    """The request's sentences and beam, within the limits."""
    sentences = [req.text] if isinstance(req.text, str) else req.text
    if not sentences:
        raise _fail(422, "text", "an empty list; give at least one sentence")
    if len(sentences) > limits.max_sentences:
        raise _fail(422, "text", f"{len(sentences)} sentences; the limit is {limits.max_sentences}")
    for i, s in enumerate(sentences):
        if len(s) > limits.max_chars:
            where = "text" if isinstance(req.text, str) else f"text[{i}]"
            raise _fail(422, where, f"{len(s):,} characters; the limit is {limits.max_chars:,}")
    beam = default_beam if req.beam is None else req.beam
    if beam > limits.max_beam:
        raise _fail(422, "beam", f"{beam}; the limit is {limits.max_beam}")
    if req.nbest > beam:
        raise _fail(422, "nbest", f"{req.nbest} is more than the beam ({beam})")
    return sentences, beam


def _answer(t: Translation, *, nbest: int, attention: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"text": t.text, "score": round(t.score, 4), "truncated": t.truncated}
    if nbest > 1:
        out["nbest"] = [{"text": text, "score": round(score, 4)} for text, score in t.nbest]
    if attention:
        out["attention"] = {
            "source": t.src_tokens,  # columns
            "target": t.tgt_labels,  # rows
            "weights": [[round(w, 4) for w in row] for row in t.attention.tolist()],
        }
    return out


def info_of(translator: Translator, limits: Limits) -> dict[str, Any]:
    """GET /info: what model this is, and what a request may ask of it."""
    cfg = translator.config
    return {
        "model": str(translator.path) if translator.path else None,
        "languages": {"source": cfg.data.src_lang, "target": cfg.data.tgt_lang},
        "vocabulary": {
            "source": translator.tokenizer.src_vocab_size,
            "target": translator.tokenizer.tgt_vocab_size,
            "joint": translator.tokenizer.joint,
        },
        "architecture": asdict(cfg.model),  # the run's model section, as configured
        "decode": {"beam": cfg.decode.beam, "length_penalty": cfg.decode.length_penalty},
        "device": str(translator.device),
        "precision": translator.precision,
        "limits": asdict(limits),
    }


def create_app(translator: Translator, limits: Limits | None = None) -> FastAPI:
    """The ASGI app serving `translator`: POST /translate, GET /health, /info and the page."""
    limits = limits or Limits()
    batcher = Batcher(translator, limits)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(
        title="nmt",
        summary=f"{translator.config.data.src_lang}->{translator.config.data.tgt_lang} "
        "neural machine translation",
        lifespan=lifespan,
    )
    page = resources.files("nmt").joinpath("page.html").read_text(encoding="utf-8")
    schema = {"application/json": {"schema": TranslateRequest.model_json_schema()}}

    @app.post("/translate", openapi_extra={"requestBody": {"content": schema, "required": True}})
    async def translate(request: Request) -> dict[str, Any]:
        """Translate `text` (a sentence or a list); `beam`, `nbest` and `attention` optional."""
        batcher.counters.requests += 1
        try:
            body = await _read_json(request, limits.max_body_bytes)
            try:
                req = TranslateRequest.model_validate(body)
            except ValidationError as e:
                raise HTTPException(422, detail=_problem(e.errors())) from None
            sentences, beam = _check(req, limits, translator.config.decode.beam)
        except HTTPException:
            batcher.counters.errors += 1
            raise
        start = time.perf_counter()
        try:
            out = await batcher.translate(sentences, beam=beam, nbest=req.nbest)
        except Exception as e:  # logged by the batcher; this request fails, not the server
            batcher.counters.errors += 1
            raise _fail(500, "text", f"decoding failed ({type(e).__name__})") from None
        batcher.counters.sentences += len(sentences)
        return {
            "translations": [_answer(t, nbest=req.nbest, attention=req.attention) for t in out],
            "beam": beam,
            "milliseconds": round(1000 * (time.perf_counter() - start), 1),
        }

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Up, with what it has done since it started."""
        return {"status": "ok", **asdict(batcher.counters)}

    @app.get("/info")
    async def info() -> dict[str, Any]:
        """The model, its vocabulary and architecture, the device and the request limits."""
        return info_of(translator, limits)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> str:
        return page

    return app


@dataclass
class ServeOptions:
    """`nmt serve`'s options beyond the model."""

    host: str = "127.0.0.1"
    port: int = 8080
    limits: Limits = field(default_factory=Limits)
    log_level: str = "info"
    drain_seconds: float = 30.0  # on SIGTERM, how long in-flight requests may take


def serve(translator: Translator, options: ServeOptions) -> None:
    """Bind, say where, and serve until SIGINT/SIGTERM; in-flight requests are answered
    before the process exits."""
    import signal
    import socket

    import uvicorn

    from nmt.errors import NmtError

    family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((options.host, options.port))
    except OSError as e:
        sock.close()
        where = f"--host {options.host} --port {options.port}"
        raise NmtError(f"{where}: cannot listen ({e.strerror})") from None
    sock.listen(2048)
    host, port = sock.getsockname()[:2]
    app = create_app(translator, options.limits)
    config = uvicorn.Config(
        app,
        log_level=options.log_level,
        timeout_graceful_shutdown=int(options.drain_seconds),
    )
    url = f"http://{host if family == socket.AF_INET else f'[{host}]'}:{port}"
    print(f"nmt serve: {url} (page {url}/, API docs {url}/docs); Ctrl-C stops", flush=True)
    # uvicorn drains on SIGTERM, then raises the signal again for the handler it found: make
    # that one do nothing, so that a drained server exits 0 (Ctrl-C still exits 130).
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    uvicorn.Server(config).run(sockets=[sock])
