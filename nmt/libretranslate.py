"""LibreTranslate's HTTP API, so that its clients (its Python client, browser extensions,
editors, chat bots) work against `nmt serve` unchanged: point them at
`http://HOST:PORT/libretranslate/`.

- `POST /libretranslate/translate` with `q` (a string or a list), `source`, `target`,
  `format` (`text`; `html` is refused) and an ignored `api_key`, as JSON or as a form (the
  Python client sends forms) -> `{"translatedText": ...}` (a list for a list);
- `GET /libretranslate/languages` -> `[{"code", "name", "targets"}]`: the model's pair;
- errors as `{"error": "..."}` with LibreTranslate's status codes (400 a bad request or an
  unsupported pair, 403 another site, 429 busy, 500 decoding failed).

Under a prefix rather than on the root: nmt's own `POST /translate` takes `text`, and each
API keeps its own errors. Requests are decoded by the server's one batcher, with the
sentences of every other request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

if TYPE_CHECKING:
    from nmt.batcher import Batcher
    from nmt.limits import Limits
    from nmt.translate import Translator

PREFIX = "/libretranslate"
# Names for the languages a model may translate; other codes are shown as they are.
NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
    "fr": "French", "it": "Italian", "ja": "Japanese", "nl": "Dutch", "pl": "Polish",
    "pt": "Portuguese", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}  # fmt: skip


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _fields(request: Request, limits: Limits) -> dict[str, Any]:
    """The request's fields, from JSON or a form (urlencoded), whatever the content type."""
    from nmt.serve import parse_json, read_body

    body = await read_body(request, limits)
    if body.lstrip()[:1] in (b"{", b"["):
        data = parse_json(body)
        if not isinstance(data, dict):
            raise HTTPException(400, detail="body: expected a JSON object")
        return data
    try:
        form = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise HTTPException(400, detail="body: not UTF-8") from None
    return {k: v if k == "q" and len(v) > 1 else v[0] for k, v in form.items()}


def libretranslate_router(translator: Translator, batcher: Batcher, limits: Limits) -> APIRouter:
    """The LibreTranslate endpoints for `translator`, decoding through `batcher`."""
    from nmt.serve import CLIENT_GONE, check_origin, check_sentences, decode

    router = APIRouter(prefix=PREFIX, tags=["LibreTranslate"])
    src, tgt = translator.config.data.src_lang, translator.config.data.tgt_lang
    counters = batcher.counters

    @router.post("/translate")
    async def translate(request: Request) -> JSONResponse:
        """LibreTranslate's translate: `q`, `source`, `target`, `format`."""
        counters.requests += 1
        try:
            check_origin(request)
            fields = await _fields(request, limits)
            q = fields.get("q")
            if q is None:
                raise HTTPException(400, detail="Invalid request: missing q parameter")
            if not isinstance(q, (str, list)) or not all(isinstance(x, str) for x in q):
                raise HTTPException(400, detail="q: expected a string or a list of strings")
            source, target = fields.get("source", src), fields.get("target", tgt)
            if source not in (src, "auto") or target != tgt:
                raise HTTPException(
                    400, detail=f"{source} -> {target} is not supported; this model: {src} -> {tgt}"
                )
            if fields.get("format", "text") != "text":
                raise HTTPException(400, detail="format: only text is supported (not html)")
            single = isinstance(q, str)
            given = [q] if isinstance(q, str) else [str(x) for x in q]
            sentences = check_sentences(given, single, limits, field="q")
            beam = translator.config.decode.beam
            out = await decode(batcher, sentences, min(beam, limits.max_beam), 1, request)
        except HTTPException as e:
            if e.status_code == CLIENT_GONE:
                counters.dropped += 1
                return _error(e.status_code, str(e.detail))
            counters.errors += 1
            status = {422: 400, 503: 429}.get(e.status_code, e.status_code)
            return _error(status, str(e.detail), getattr(e, "headers", None))
        counters.sentences += len(sentences)
        texts = [t.text for t in out]
        return JSONResponse({"translatedText": texts[0] if single else texts})

    @router.get("/languages")
    async def languages() -> list[dict[str, Any]]:
        """The languages this model reads and writes, LibreTranslate's way."""
        return [
            {"code": src, "name": NAMES.get(src, src), "targets": [tgt]},
            {"code": tgt, "name": NAMES.get(tgt, tgt), "targets": []},
        ]

    return router
