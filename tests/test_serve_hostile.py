"""`nmt serve` against hostile and careless clients, and LibreTranslate's clients, all
through real HTTP on a free localhost port. Every loop here is bounded in count and time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import uvicorn

from nmt.batcher import Batcher, Busy
from nmt.limits import Limits
from nmt.serve import create_app
from nmt.translate import Translator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from load_test import running_server  # noqa: E402


@contextlib.contextmanager
def app_server(translator, limits: Limits | None = None) -> Iterator[str]:
    """The app (with any translator, e.g. a slow or failing one) under uvicorn on a free
    loopback port, in a thread; its base URL."""
    from nmt.http_guard import guarded_protocol

    limits = limits or Limits()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(translator, limits, loopback=True),
        http=guarded_protocol(limits.header_seconds),
        limit_concurrency=limits.max_connections,
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture(scope="module")
def served(tiny_run):
    with running_server(str(tiny_run.run_dir), "--header-timeout", "1", "--body-timeout", "1") as s:
        yield s
    assert "Traceback" not in s.stderr_text  # every bad request answered, none crashed


def health(url: str) -> dict:
    return httpx.get(f"{url}/health", timeout=10).json()


# ---------------------------------------------------------------- 1: bodies that break parsers


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b'{"text": "a dog", "beam": ' + b"9" * 5000 + b"}", 400, "body: a number too long"),
        (b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "body: nested too deeply"),
        (b'{"text": "a \\ud800 dog"}', 422, "text: not valid Unicode"),
        (b'{"text": ["a dog", "\\udfff"]}', 422, "text[1]: not valid Unicode"),
        # values of the wrong JSON type are refused, not coerced (true would be beam 1)
        (b'{"text": "a dog", "beam": true}', 422, "beam: Input should be a valid integer"),
        (b'{"text": "a dog", "beam": "5"}', 422, "beam: Input should be a valid integer"),
        (b'{"text": "a dog", "nbest": 2.0}', 422, "nbest: Input should be a valid integer"),
        (b'{"text": "a dog", "attention": "yes"}', 422, "attention: Input should be a valid"),
        (b'{"text": "a dog", "heads": 1}', 422, "heads: Input should be a valid boolean"),
    ],
)
def test_bodies_that_break_the_parser_get_4xx_naming_the_field(served, body, status, needle):
    before = health(served.url)["errors"]
    r = httpx.post(f"{served.url}/translate", content=body, timeout=30)
    assert r.status_code == status and r.json()["detail"].startswith(needle), r.text
    assert health(served.url)["errors"] == before + 1
    r = httpx.post(f"{served.url}/translate", json={"text": "a dog"}, timeout=30)
    assert r.status_code == 200  # and the server goes on


def test_one_failing_request_fails_alone_among_those_batched_with_it(tiny_run):
    translator = Translator.from_checkpoint(tiny_run.run_dir)
    real = translator.translate

    def fragile(sources, **kw):  # the batcher passes sentences prepared (tokenized) once
        if any("BOOM" in s.sentence for s in sources):
            raise RuntimeError("cannot decode")
        return real(sources, **kw)

    translator.translate = fragile  # type: ignore[method-assign]
    with app_server(translator, Limits(batch_wait_ms=300)) as url:
        texts = ["a dog", "BOOM", "a cat", "two men"]
        with ThreadPoolExecutor(4) as pool:
            answers = list(
                pool.map(
                    lambda t: httpx.post(f"{url}/translate", json={"text": t}, timeout=30), texts
                )
            )
        assert [r.status_code for r in answers] == [200, 500, 200, 200]
        assert health(url)["batches"] < 8  # they were decoded together first


# ---------------------------------------------------------------- 2: slow clients


def test_a_client_that_never_finishes_its_headers_is_disconnected(served):
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        start = time.monotonic()
        s.settimeout(10)
        assert s.recv(100) == b""  # closed by the server
        assert time.monotonic() - start < 5


def test_a_client_that_never_finishes_its_body_gets_408(served):
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        head = b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n"
        s.sendall(head + b'{"text": "a')
        s.settimeout(10)
        assert b" 408 " in s.recv(200).split(b"\r\n")[0]


def test_connections_beyond_the_limit_are_refused(tiny_run):
    translator = Translator.from_checkpoint(tiny_run.run_dir)
    with app_server(translator, Limits(max_connections=2, header_seconds=5)) as url:
        host, port = url.removeprefix("http://").split(":")
        held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(2)]
        for s in held:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # unfinished
        time.sleep(0.3)
        try:
            r = httpx.get(f"{url}/health", timeout=10)
            assert r.status_code == 503
        finally:
            for s in held:
                s.close()


# ---------------------------------------------------------------- 3: vanished clients, queue, time


def test_a_request_whose_client_left_is_not_decoded(tiny_run):
    translator = Translator.from_checkpoint(tiny_run.run_dir)
    with app_server(translator, Limits(batch_wait_ms=800)) as url:
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps({"text": "a dog runs"}).encode()
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(
                b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                + f"\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            time.sleep(0.2)  # read by the server, waiting in the batcher
        deadline = time.monotonic() + 10
        while health(url)["dropped"] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert health(url)["dropped"] == 1 and health(url)["batches"] == 0


def _slow(translator: Translator, seconds: float) -> Translator:
    real = translator.translate

    def slow(sentences, **kw):
        time.sleep(seconds)
        return real(sentences, **kw)

    translator.translate = slow  # type: ignore[method-assign]
    return translator


def test_a_full_queue_answers_503_with_retry_after_and_a_slow_request_503(tiny_run):
    translator = _slow(Translator.from_checkpoint(tiny_run.run_dir), 0.6)
    limits = Limits(max_queue=1, batch_sentences=1, request_seconds=1.5)
    with app_server(translator, limits) as url:
        with ThreadPoolExecutor(5) as pool:
            answers = list(
                pool.map(
                    lambda t: httpx.post(f"{url}/translate", json={"text": t}, timeout=30),
                    ["a dog", "a cat", "a man", "a boy", "a girl"],
                )
            )
        codes = [r.status_code for r in answers]
        busy = [r for r in answers if r.status_code == 503 and "busy" in r.json()["detail"]]
        assert 200 in codes and busy, codes
        assert all(r.headers.get("retry-after") == "1" for r in busy)
        slow = [r for r in answers if r.status_code == 503 and "took" in r.json()["detail"]]
        h = health(url)
        assert h["busy"] == len(busy) and h["timeouts"] == len(slow)


def test_the_batcher_refuses_past_its_queue():
    class Slow:
        def prepare(self, sentences):
            return [SimpleNamespace(text=s, pieces=SimpleNamespace(ids=[1])) for s in sentences]

        def translate(self, sources, **kw):
            time.sleep(0.3)
            return [s.text for s in sources]

    async def main():
        batcher = Batcher(Slow(), Limits(max_queue=1, batch_sentences=1, batch_wait_ms=0))  # type: ignore[arg-type]
        batcher.start()
        first = asyncio.create_task(batcher.translate(["a"], beam=1, nbest=1))
        await asyncio.sleep(0.05)  # taken: being decoded
        second = asyncio.create_task(batcher.translate(["b"], beam=1, nbest=1))
        await asyncio.sleep(0.01)  # waiting in the queue
        with pytest.raises(Busy):
            await batcher.translate(["c"], beam=1, nbest=1)
        assert await first == ["a"] and await second == ["b"]
        await batcher.stop()

    asyncio.run(main())


# ---------------------------------------------------------------- 4, 5: options, browsers


def test_listening_beyond_loopback_warns(tiny_run):
    with running_server(str(tiny_run.run_dir), "--host", "0.0.0.0") as s:
        r = httpx.get(s.url.replace("0.0.0.0", "127.0.0.1") + "/health", timeout=10)
        assert r.status_code == 200
    assert "beyond this machine" in s.stderr_text


def test_only_loopback_host_names_and_same_origin_pages_are_answered(served):
    r = httpx.get(f"{served.url}/info", headers={"Host": "attacker.example"}, timeout=10)
    assert r.status_code == 400
    r = httpx.post(
        f"{served.url}/translate",
        content=b'{"text": "a dog"}',
        headers={"Origin": "http://attacker.example", "Content-Type": "text/plain"},
        timeout=10,
    )
    assert r.status_code == 403 and r.json()["detail"].startswith("origin:")
    assert "access-control-allow-origin" not in r.headers
    host = served.url.removeprefix("http://")
    r = httpx.post(
        f"{served.url}/translate",
        json={"text": "a dog"},
        headers={"Origin": served.url},
        timeout=10,
    )
    assert r.status_code == 200  # the page, from the same origin
    r = httpx.post(
        f"{served.url}/translate",
        content=b'{"text": "a dog"}',
        headers={"Content-Type": "application/x-www-form-urlencoded", "Host": host},
        timeout=10,
    )
    assert r.status_code == 200  # curl -d


# ---------------------------------------------------------------- 6: big answers off the loop


def test_health_stays_fast_while_a_big_answer_is_built(served):
    body = {"text": [f"a dog runs in the park number {i}" for i in range(64)], "beam": 16}
    body["attention"] = True
    done: list[httpx.Response] = []
    worker = threading.Thread(
        target=lambda: done.append(httpx.post(f"{served.url}/translate", json=body, timeout=120))
    )
    worker.start()
    slowest = 0.0
    polls = 0
    while worker.is_alive() and polls < 500:
        start = time.monotonic()
        assert httpx.get(f"{served.url}/health", timeout=10).status_code == 200
        slowest = max(slowest, time.monotonic() - start)
        polls += 1
        time.sleep(0.02)
    worker.join(timeout=120)
    assert done and done[0].status_code == 200 and len(done[0].json()["translations"]) == 64
    assert slowest < 1.0, slowest


# ---------------------------------------------------------------- 8, 9: LibreTranslate clients


def test_libretranslatepy_translates_lists_languages_and_gets_errors(served, tiny_run):
    from urllib.error import HTTPError

    from libretranslatepy import LibreTranslateAPI

    lt = LibreTranslateAPI(f"{served.url}/libretranslate/")
    alone = Translator.from_checkpoint(tiny_run.run_dir).translate(["a dog runs"])[0].text
    assert lt.translate("a dog runs", "en", "fr") == alone
    codes = {lang["code"]: lang for lang in lt.languages()}
    assert codes["en"]["targets"] == ["fr"] and codes["en"]["name"] == "English"
    with pytest.raises(HTTPError) as err:
        lt.translate("a dog runs", "en", "de")
    assert err.value.code == 400 and "not supported" in json.loads(err.value.read())["error"]
    # A list, as JSON (what the JavaScript clients send).
    r = httpx.post(
        f"{served.url}/libretranslate/translate",
        json={"q": ["a dog runs", "a cat"], "source": "auto", "target": "fr", "format": "text"},
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["translatedText"][0] == alone
    r = httpx.post(f"{served.url}/libretranslate/translate", json={"source": "en"}, timeout=30)
    assert r.status_code == 400 and "q" in r.json()["error"]
