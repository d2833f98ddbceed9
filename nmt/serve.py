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

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import ClientDisconnect

from nmt.batcher import Batcher, Busy, Gone, TooSlow
from nmt.errors import DecodeArgumentError
from nmt.limits import Limits
from nmt.search import check_decode_args
from nmt.translate import Translation, Translator


class TranslateRequest(BaseModel):
    """The body of POST /translate."""

    model_config = ConfigDict(extra="forbid", strict=True)  # true is no beam size, "5" no number

    text: str | list[str] = Field(description="A sentence, or a list of sentences.")
    beam: int | None = Field(None, ge=1, description="Beam size, 1 = greedy; default: the model's.")
    nbest: int = Field(1, ge=1, description="Translations returned per sentence, best first.")
    attention: bool = Field(False, description="Return each attention matrix.")
    heads: bool = Field(
        False,
        description="With attention: also each attention head's weights (a list, one matrix a "
        "head; multi-head models, not ensembles).",
    )


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


async def read_body(request: Request, limits: Limits) -> bytes:
    """The request body, refused past `limits.max_body_bytes` before more is read (413), and
    past `limits.body_seconds` (408: a client that sends it a byte at a time holds a
    connection for nothing)."""
    limit = limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _fail(413, "body", f"{int(declared):,} bytes; the limit is {limit:,}")
    body = bytearray()
    try:
        async with asyncio.timeout(limits.body_seconds):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise _fail(413, "body", f"more than {limit:,} bytes; the limit is {limit:,}")
    except TimeoutError:
        raise _fail(408, "body", f"not received within {limits.body_seconds:g} s") from None
    except ClientDisconnect:  # gone before its body was in: nobody to answer
        raise HTTPException(CLIENT_GONE, detail="body: the client disconnected") from None
    return bytes(body)


def parse_json(body: bytes) -> Any:
    """JSON, or a 400 naming why: bad bytes, bad syntax, a number too long for Python's int
    (thousands of digits), nesting deeper than the parser's recursion."""
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(400, "body", f"not JSON ({e})") from None
    except ValueError as e:  # int too long to convert
        raise _fail(400, "body", f"a number too long ({' '.join(str(e).split())[:80]})") from None
    except RecursionError:
        raise _fail(400, "body", "nested too deeply") from None


def _check(req: TranslateRequest, limits: Limits, default_beam: int) -> tuple[list[str], int]:
    """The request's sentences and beam, within the limits."""
    single = isinstance(req.text, str)
    given = [req.text] if isinstance(req.text, str) else list(req.text)
    sentences = check_sentences(given, single, limits)
    beam = default_beam if req.beam is None else req.beam
    if req.heads and not req.attention:
        raise _fail(422, "heads", "true needs attention: true too")
    if beam > limits.max_beam:
        raise _fail(422, "beam", f"{beam}; the limit is {limits.max_beam}")
    try:
        check_decode_args(beam=beam, nbest=req.nbest)
    except DecodeArgumentError as e:
        raise _fail(422, e.argument, f"{e.value}: expected {e.expected}") from None
    return sentences, beam


def check_sentences(
    sentences: list[str], single: bool, limits: Limits, field: str = "text"
) -> list[str]:
    """The sentences of a request within the limits, each one real Unicode: JSON may carry
    a lone surrogate ("\\ud800"), which no tokenizer reads. `single`: given as one string,
    not a list (errors then name the field, not an item)."""
    if not sentences:
        raise _fail(422, field, "an empty list; give at least one sentence")
    if len(sentences) > limits.max_sentences:
        raise _fail(422, field, f"{len(sentences)} sentences; the limit is {limits.max_sentences}")
    for i, s in enumerate(sentences):
        where = field if single else f"{field}[{i}]"
        if len(s) > limits.max_chars:
            raise _fail(422, where, f"{len(s):,} characters; the limit is {limits.max_chars:,}")
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as e:
            raise _fail(422, where, f"not valid Unicode (a lone surrogate at {e.start})") from None
    return sentences


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
        if t.copied is not None:  # copy attention: the share of each row copied, 1 - g
            out["attention"]["copy"] = [round(c, 4) for c in t.copied]
        if t.heads is not None:  # asked for: (H, T, S), each head's rows like `weights`
            out["attention"]["heads"] = [
                [[round(w, 4) for w in row] for row in head] for head in t.heads.tolist()
            ]
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


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")
CLIENT_GONE = 499  # nginx's status for a request whose client left: never read by anyone


def check_origin(request: Request) -> None:
    """Refuse a request a browser sends on behalf of another site (403): its Origin names
    another host than the one it asks. curl and the clients send no Origin; the page is
    served from the same origin. CORS is off: no other site may read an answer either."""
    origin = request.headers.get("origin")
    if origin is None:
        return
    host = request.headers.get("host", "")
    if origin == "null" or origin.partition("://")[2].rstrip("/") != host:
        raise _fail(403, "origin", f"{origin[:80]}: requests from other sites are refused")


def create_app(
    translator: Translator, limits: Limits | None = None, *, loopback: bool = False
) -> FastAPI:
    """The ASGI app serving `translator`: POST /translate, GET /health, /info, the page, and
    LibreTranslate's API under /libretranslate (`nmt.libretranslate`). `loopback`: it
    listens on this machine only, so only loopback host names are answered (a web page
    that rebinds its own name to 127.0.0.1 gets nothing)."""
    from nmt.libretranslate import libretranslate_router

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
    if loopback:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(LOOPBACK_HOSTS))
    page = resources.files("nmt").joinpath("page.html").read_text(encoding="utf-8")
    schema = {"application/json": {"schema": TranslateRequest.model_json_schema()}}
    counters = batcher.counters

    @app.post("/translate", openapi_extra={"requestBody": {"content": schema, "required": True}})
    async def translate(request: Request) -> Response:
        """Translate `text` (a sentence or a list); `beam`, `nbest` and `attention` optional."""
        counters.requests += 1
        start = time.perf_counter()
        try:
            check_origin(request)
            body = parse_json(await read_body(request, limits))
            try:
                req = TranslateRequest.model_validate(body)
            except ValidationError as e:
                raise HTTPException(422, detail=_problem(e.errors())) from None
            sentences, beam = _check(req, limits, translator.config.decode.beam)
            out = await decode(batcher, sentences, beam, req.nbest, request, heads=req.heads)
        except HTTPException as e:
            if e.status_code == CLIENT_GONE:
                counters.dropped += 1
            else:
                counters.errors += 1
            raise
        counters.sentences += len(sentences)
        ms = round(1000 * (time.perf_counter() - start), 1)
        # Attention matrices of 64 beam-16 sentences are megabytes of JSON: built off the
        # event loop, which goes on answering /health meanwhile.
        content = await asyncio.to_thread(_encode, out, req, beam, ms)
        return Response(content, media_type="application/json")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Up, with what it has done since it started."""
        return {"status": "ok", **asdict(counters)}

    @app.get("/info")
    async def info() -> dict[str, Any]:
        """The model, its vocabulary and architecture, the device and the request limits."""
        return info_of(translator, limits)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> str:
        return page

    app.include_router(libretranslate_router(translator, batcher, limits))
    return app


async def decode(
    batcher: Batcher,
    sentences: list[str],
    beam: int,
    nbest: int,
    request: Request,
    heads: bool = False,
) -> list[Translation]:
    """The batcher's answer, or the HTTP error that says why not (503 busy or too slow,
    500 decoding failed)."""
    try:
        return await batcher.translate(
            sentences, beam=beam, nbest=nbest, heads=heads, gone=request.is_disconnected
        )
    except Busy as e:
        raise HTTPException(503, detail=f"text: busy ({e})", headers={"Retry-After": "1"}) from None
    except TooSlow as e:
        raise _fail(503, "text", f"decoding took {e}") from None
    except Gone:
        raise HTTPException(CLIENT_GONE, detail="text: the client disconnected") from None
    except Exception as e:  # logged by the batcher; this request fails, not the server
        raise _fail(500, "text", f"decoding failed ({type(e).__name__})") from None


def _encode(out: list[Translation], req: TranslateRequest, beam: int, ms: float) -> bytes:
    answer = {
        "translations": [_answer(t, nbest=req.nbest, attention=req.attention) for t in out],
        "beam": beam,
        "milliseconds": ms,
    }
    return json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


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
    import ipaddress
    import signal
    import socket
    import sys

    import uvicorn

    from nmt.errors import NmtError
    from nmt.http_guard import guarded_protocol

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
    loopback = ipaddress.ip_address(host).is_loopback
    if not loopback:
        print(
            f"nmt serve: warning: listening on {host or 'every interface'}, beyond this "
            "machine: anyone who can reach it can use it (no authentication)",
            file=sys.stderr,
            flush=True,
        )
    app = create_app(translator, options.limits, loopback=loopback)
    config = uvicorn.Config(
        app,
        http=guarded_protocol(options.limits.header_seconds),
        limit_concurrency=options.limits.max_connections,
        log_level=options.log_level.lower(),
        timeout_graceful_shutdown=int(options.drain_seconds),
    )
    url = f"http://{host if family == socket.AF_INET else f'[{host}]'}:{port}"
    print(f"nmt serve: {url} (page {url}/, API docs {url}/docs); Ctrl-C stops", flush=True)
    # uvicorn drains on SIGTERM, then raises the signal again for the handler it found: make
    # that one do nothing, so that a drained server exits 0 (Ctrl-C still exits 130).
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    uvicorn.Server(config).run(sockets=[sock])
