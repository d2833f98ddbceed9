"""`nmt serve` through real HTTP: a server process on a free localhost port, a real client.

Each caller gets what the library gives for its sentences alone, however requests are
batched; bad requests are refused with a status and a message naming the field, and the
server goes on; SIGTERM answers what is under way before the process exits.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import httpx
import pytest
from children import interrupted_start

from nmt.translate import Translator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from load_test import Served, measure, running_server  # noqa: E402


def post(server: Served, body: object) -> httpx.Response:
    return httpx.post(f"{server.url}/translate", json=body, timeout=60)


def health(server: Served) -> dict:
    return httpx.get(f"{server.url}/health", timeout=10).json()


@pytest.fixture(scope="module")
def server(tiny_run) -> Iterator[Served]:
    with running_server(str(tiny_run.run_dir), "--device", "cpu") as served:
        yield served


@pytest.fixture(scope="module")
def translator(tiny_run) -> Translator:
    return Translator.from_checkpoint(tiny_run.run_dir)


def test_one_sentence_and_a_list_get_what_the_library_gives(server, translator, tiny_run):
    sentences = tiny_run.train_src[:5]
    alone = translator.translate(sentences, beam=3)
    r = post(server, {"text": sentences[0], "beam": 3})
    assert r.status_code == 200, r.text
    (only,) = r.json()["translations"]
    assert only["text"] == alone[0].text
    assert only["score"] == pytest.approx(alone[0].score, abs=1e-4)
    r = post(server, {"text": sentences, "beam": 3})
    assert [t["text"] for t in r.json()["translations"]] == [t.text for t in alone]
    assert r.json()["beam"] == 3


def test_curls_form_encoded_json_is_read_as_json(server, translator, tiny_run):
    """`curl -d '{"text": ...}'` sends the JSON as form data: it is still JSON."""
    body = json.dumps({"text": tiny_run.train_src[0]})
    headers = {"content-type": "application/x-www-form-urlencoded"}
    r = httpx.post(f"{server.url}/translate", content=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    (alone,) = translator.translate(tiny_run.train_src[:1])
    assert r.json()["translations"][0]["text"] == alone.text


def test_concurrent_requests_are_decoded_together_each_as_alone(server, translator, tiny_run):
    sentences = tiny_run.train_src[:24]
    alone = {s: t for s, t in zip(sentences, translator.translate(sentences, beam=2), strict=True)}
    before = health(server)
    gate = threading.Barrier(len(sentences))

    def call(sentence: str) -> dict:
        gate.wait()
        return post(server, {"text": sentence, "beam": 2}).json()["translations"][0]

    with ThreadPoolExecutor(len(sentences)) as pool:
        answers = list(pool.map(call, sentences))
    for sentence, answer in zip(sentences, answers, strict=True):
        assert answer["text"] == alone[sentence].text
        assert answer["score"] == pytest.approx(alone[sentence].score, abs=1e-4)
    after = health(server)
    requests = after["requests"] - before["requests"]
    assert requests == len(sentences)
    assert after["batches"] - before["batches"] < requests  # some were decoded together


def test_attention_and_nbest(server, tiny_run):
    r = post(server, {"text": [tiny_run.train_src[0]], "beam": 3, "nbest": 2, "attention": True})
    (t,) = r.json()["translations"]
    assert [n["text"] for n in t["nbest"]][0] == t["text"] and len(t["nbest"]) == 2
    att = t["attention"]
    assert att["source"][-1] == "</s>" and len(att["weights"]) == len(att["target"])
    for row in att["weights"]:
        assert len(row) == len(att["source"]) and sum(row) == pytest.approx(1, abs=1e-2)


@pytest.mark.parametrize(
    "body, status, message",
    [
        (b'{"text": "A dog', 400, "body: not JSON"),
        (b"\xff\xfe", 400, "body: not JSON"),
        (b"{}", 422, "text: Field required"),
        (b'{"text": 5}', 422, "text: Input should be a valid string"),
        (b'{"text": ["a", 5]}', 422, "text[1]: Input should be a valid string"),
        (b'{"text": []}', 422, "text: an empty list"),
        (json.dumps({"text": ["a dog"] * 65}).encode(), 422, "text: 65 sentences; the limit is 64"),
        (json.dumps({"text": ["ok", "x" * 1001]}).encode(), 422, "text[1]: 1,001 characters"),
        (json.dumps({"text": "x" * 1001}).encode(), 422, "text: 1,001 characters"),
        (b'{"text": "a", "beam": 0}', 422, "beam: Input should be greater than or equal to 1"),
        (b'{"text": "a", "beam": 17}', 422, "beam: 17; the limit is 16"),
        (b'{"text": "a", "beam": 3, "nbest": 4}', 422, "nbest: 4: expected 1 to the beam size (3)"),
        (b'{"text": "a", "model": "/etc/passwd"}', 422, "model: Extra inputs are not permitted"),
        (b'{"text": "a", "attention": "maybe"}', 422, "attention"),
        (b"[1, 2]", 422, "body"),
        (json.dumps({"text": "a" * (1 << 20)}).encode(), 413, "body: "),
    ],
)
def test_bad_requests_are_refused_naming_the_field_and_the_server_goes_on(
    server, body, status, message
):
    r = httpx.post(f"{server.url}/translate", content=body, timeout=60)
    assert r.status_code == status, r.text
    assert message in r.json()["detail"]
    assert post(server, {"text": "a dog"}).status_code == 200


def test_info_health_docs_and_page(server, tiny_run):
    info = httpx.get(f"{server.url}/info").json()
    assert info["languages"] == {"source": "en", "target": "fr"}
    assert info["vocabulary"]["target"] > 0 and info["architecture"]["attention"] == "concat"
    assert info["limits"]["max_beam"] == 16 and info["device"] == "cpu"
    assert Path(info["model"]).name == "best.pt"
    assert health(server)["status"] == "ok"
    spec = httpx.get(f"{server.url}/openapi.json").json()
    schema = spec["paths"]["/translate"]["post"]["requestBody"]["content"]["application/json"]
    assert set(schema["schema"]["properties"]) == {"text", "beam", "nbest", "attention", "heads"}
    assert httpx.get(f"{server.url}/docs").status_code == 200
    page = httpx.get(f"{server.url}/")
    assert page.status_code == 200 and 'id="source"' in page.text and "/translate" in page.text


def test_sigterm_answers_the_requests_under_way_then_exits(tiny_run):
    """Requests decoded one at a time (--max-batch 1): SIGTERM comes when the first answer
    does, and every other request, already accepted, is still answered."""
    with running_server(str(tiny_run.run_dir), "--device", "cpu", "--max-batch", "1") as server:
        body = {"text": tiny_run.train_src[:32], "beam": 8}

        def call() -> tuple[httpx.Response, float]:
            reply = post(server, body)
            return reply, time.monotonic()

        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(call) for _ in range(8)]
            wait(futures, return_when=FIRST_COMPLETED)
            signalled = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            replies = [f.result() for f in futures]
        assert all(r.status_code == 200 for r, _ in replies)
        assert server.proc.wait(timeout=30) == 0
        assert sum(t > signalled for _, t in replies) >= 1


def test_load_test_script_measures_both_servers_without_errors(tiny_run):
    """scripts/load_test.py's measurement, briefly: every request answered, and batching
    makes fewer decoding calls than requests."""
    sentences = tiny_run.train_src
    loads = []
    for mode, extra in (("batched", []), ("one at a time", ["--max-batch", "1"])):
        with running_server(str(tiny_run.run_dir), "--device", "cpu", *extra) as server:
            run = measure(server.url, mode, sentences, clients=8, seconds=1.5, beam=2)
            loads.append(asyncio.run(run))
    batched, alone = loads
    assert batched.errors == alone.errors == 0
    assert batched.requests > 0 and alone.requests > 0
    assert alone.batches == alone.requests and batched.batches < batched.requests


def test_cli_errors_are_one_line_and_exit_2(tiny_run):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = str(taken.getsockname()[1])
    try:
        for args, message in [
            (["--port", port], f"--port {port}: cannot listen"),
            (["--max-batch", "0"], "--max-batch 0: expected a finite number from 1 to 4096"),
            (["--port", "70000"], "--port 70000: expected 0 to 65535"),
        ]:
            cmd = [sys.executable, "-m", "nmt", "serve", "-m", str(tiny_run.run_dir), *args]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            assert done.returncode == 2, done.stderr
            assert done.stderr.count("\n") == 1 and message in done.stderr
    finally:
        taken.close()


def test_a_decoding_failure_fails_its_request_not_the_server(tiny_run):
    """In process: a translator that raises once answers that request with a 500 naming the
    error; the next request is served."""
    from fastapi.testclient import TestClient

    from nmt.serve import create_app

    translator = Translator.from_checkpoint(tiny_run.run_dir)
    real = translator.translate
    calls = []

    def flaky(sentences, **kw):
        calls.append(sentences)
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        return real(sentences, **kw)

    translator.translate = flaky  # type: ignore[method-assign]
    with TestClient(create_app(translator)) as client:
        r = client.post("/translate", json={"text": "a dog"})
        assert r.status_code == 500 and r.json()["detail"] == "text: decoding failed (RuntimeError)"
        r = client.post("/translate", json={"text": "a dog"})
        assert r.status_code == 200 and r.json()["translations"][0]["text"]
        assert client.get("/health").json()["errors"] == 1


def test_ctrl_c_while_the_server_starts_ends_it(tiny_run):
    """`running_server` (the load test's and these tests' server) ends the server it started
    however early a Ctrl-C comes: one while Popen returned used to leave it serving."""
    code = (
        "from load_test import running_server\n"
        f"with running_server({str(tiny_run.run_dir)!r}, '--device', 'cpu'):\n    pass\n"
    )
    assert interrupted_start(str(ROOT / "scripts"), code, "while it starts") == "ended\n"
