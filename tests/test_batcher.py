"""The server's micro-batching (`nmt.batcher`), with a stand-in translator: requests that
arrive together are decoded in one call and one search batch, each answered with its own
translations; a failing sentence fails only its own request."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from nmt.batcher import Batcher
from nmt.limits import Limits


class Recorder:
    """Tokenizes a sentence into one id per word; translates it as itself in capitals."""

    def __init__(self, fail_on: str = "") -> None:
        self.prepared: list[list[str]] = []
        self.calls: list[tuple[list[str], dict]] = []
        self.fail_on = fail_on

    def prepare(self, sentences):
        self.prepared.append(list(sentences))
        return [SimpleNamespace(text=s, pieces=SimpleNamespace(ids=s.split())) for s in sentences]

    def translate(self, sources, **kw):
        texts = [s.text for s in sources]
        self.calls.append((texts, kw))
        if self.fail_on in texts:
            raise RuntimeError("bad sentence")
        return [t.upper() for t in texts]


async def _all(batcher: Batcher, requests: list[tuple[list[str], int]]) -> list:
    batcher.start()
    try:
        tasks = [batcher.translate(s, beam=beam, nbest=1) for s, beam in requests]
        return await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await batcher.stop()


def test_requests_arriving_together_are_one_call_and_one_search_batch():
    fake = Recorder()
    batcher = Batcher(fake, Limits(batch_wait_ms=200))  # type: ignore[arg-type]
    out = asyncio.run(_all(batcher, [(["a b", "c"], 5), (["d e f"], 5), (["g"], 5)]))
    assert out == [["A B", "C"], ["D E F"], ["G"]]
    assert len(fake.calls) == 1
    texts, kw = fake.calls[0]
    assert texts == ["a b", "c", "d e f", "g"] and kw["batch_size"] == 4  # one search batch
    assert fake.prepared == [["a b", "c"], ["d e f"], ["g"]]  # each tokenized once
    assert batcher.counters.batches == 1


def test_a_batch_holds_one_beam_size_and_stays_within_its_limits():
    fake = Recorder()
    limits = Limits(batch_wait_ms=200, batch_sentences=64, batch_tokens=8)
    batcher = Batcher(fake, limits)  # type: ignore[arg-type]
    requests = [(["a"], 5), (["b"], 1), (["c d e"], 1), (["f g h i"], 1)]
    out = asyncio.run(_all(batcher, requests))
    assert out == [["A"], ["B"], ["C D E"], ["F G H I"]]
    groups = [texts for texts, _ in fake.calls]
    # beam 5 alone; then b + "c d e" (6 tokens with EOS), and "f g h i" would pass 8
    assert groups == [["a"], ["b", "c d e"], ["f g h i"]]


def test_a_failing_sentence_fails_only_its_own_request():
    fake = Recorder(fail_on="bad")
    batcher = Batcher(fake, Limits(batch_wait_ms=200))  # type: ignore[arg-type]
    good, bad, other = asyncio.run(_all(batcher, [(["x"], 5), (["bad"], 5), (["y"], 5)]))
    assert good == ["X"] and other == ["Y"]
    assert isinstance(bad, RuntimeError)
    assert [texts for texts, _ in fake.calls] == [["x", "bad", "y"], ["x"], ["bad"], ["y"]]


def test_without_waiting_a_lone_request_goes_at_once():
    fake = Recorder()
    batcher = Batcher(fake, Limits(batch_wait_ms=0.0))  # type: ignore[arg-type]
    assert asyncio.run(_all(batcher, [(["solo"], 5)])) == [["SOLO"]]
