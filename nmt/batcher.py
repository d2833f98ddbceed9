"""Micro-batching for `nmt serve`: the sentences of requests that arrive within a few
milliseconds of each other are decoded in one `Translator.translate` call, as one search
batch (the batcher is the server's one batching layer: it bounds a batch's sentences and
source tokens). Each sentence is cleaned and tokenized once, when its request arrives.

The call runs on the batcher's own thread, so the event loop keeps accepting requests while a
batch decodes; they form the next batch. The search never lets one sentence change another's
result, so each caller gets exactly what it would have got alone.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nmt.limits import Limits

if TYPE_CHECKING:
    from nmt.translate import Source, Translation, Translator

log = logging.getLogger("nmt.serve")


class Busy(Exception):
    """The queue of requests waiting to be decoded is full: come back later."""


class TooSlow(Exception):
    """A request waited and decoded longer than `Limits.request_seconds`."""


class Gone(Exception):
    """The client left before its request was decoded: it was dropped."""


@dataclass
class _Job:
    sentences: list[Source]
    beam: int
    nbest: int
    tokens: int
    future: asyncio.Future[list[Translation]]
    gone: Callable[[], Awaitable[bool]] | None = None  # whether the client has disconnected
    heads: bool = False  # each attention head's weights asked for


@dataclass
class Counters:
    """What the server has done since it started (GET /health)."""

    requests: int = 0
    sentences: int = 0
    batches: int = 0
    errors: int = 0
    dropped: int = 0  # requests whose client left before they were read or decoded
    busy: int = 0  # refused with 503: the queue was full
    timeouts: int = 0  # answered 503: longer than the request time limit


class Batcher:
    """Decodes the sentences of requests that arrive close together in one call."""

    def __init__(self, translator: Translator, limits: Limits) -> None:
        self.translator = translator
        self.limits = limits
        self.counters = Counters()
        self._queue: asyncio.Queue[_Job] = asyncio.Queue(limits.max_queue)
        # One thread: the model is used by one call at a time, and torch has its own threads.
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="nmt-decode")
        self._worker: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """After the server has answered its last request: nothing is left in the queue."""
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        self._executor.shutdown(wait=True)

    async def translate(
        self,
        sentences: list[str],
        *,
        beam: int,
        nbest: int,
        heads: bool = False,
        gone: Callable[[], Awaitable[bool]] | None = None,
    ) -> list[Translation]:
        """The translations of `sentences`, decoded with those of other requests (`heads`:
        with each attention head's weights). `gone` says whether the caller has left: then
        the request is dropped before decoding.
        Raises Busy when the queue is full, TooSlow past `Limits.request_seconds`."""
        sources = self.translator.prepare(sentences)
        tokens = sum(len(s.pieces.ids) + 1 for s in sources)  # EOS included
        future = asyncio.get_running_loop().create_future()
        job = _Job(sources, beam, nbest, tokens, future, gone, heads)
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self.counters.busy += 1
            raise Busy(f"{self.limits.max_queue} requests are waiting") from None
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.limits.request_seconds)
        except TimeoutError:
            future.cancel()  # not decoded yet: skipped; being decoded: its result dropped
            self.counters.timeouts += 1
            raise TooSlow(f"longer than {self.limits.request_seconds:g} s") from None

    async def _run(self) -> None:
        waiting: _Job | None = None
        while True:
            first = waiting or await self._queue.get()
            waiting = None
            group = [first]
            deadline = time.monotonic() + self.limits.batch_wait_ms / 1000
            n, tokens = len(first.sentences), first.tokens
            while n < self.limits.batch_sentences:
                if self._queue.empty():
                    timeout = deadline - time.monotonic()
                    if timeout <= 0:
                        break
                    try:
                        job = await asyncio.wait_for(self._queue.get(), timeout)
                    except asyncio.TimeoutError:
                        break
                else:
                    job = self._queue.get_nowait()
                fits = (
                    n + len(job.sentences) <= self.limits.batch_sentences
                    and tokens + job.tokens <= self.limits.batch_tokens
                )
                if (job.beam, job.nbest, job.heads) != (first.beam, first.nbest, first.heads):
                    fits = False  # decoded alike, or in a group of its own
                if not fits:
                    waiting = job  # the first of the next group
                    break
                group.append(job)
                n, tokens = n + len(job.sentences), tokens + job.tokens
            await self._decode(group)

    async def _decode(self, group: list[_Job]) -> None:
        live = []
        for j in group:  # timed out (cancelled) or the client has left: nothing to do
            if not j.future.done() and j.gone is not None and await j.gone():
                j.future.set_exception(Gone())  # counted as dropped by the server
            if not j.future.done():
                live.append(j)
        if not live:
            return
        try:
            out = await self._call([s for j in live for s in j.sentences], live[0])
        except Exception as e:
            if len(live) == 1:
                self._fail(live[0], e)
                return
            # One bad sentence must fail its own request only: each request alone.
            for j in live:
                try:
                    self._answer(j, await self._call(j.sentences, j))
                except Exception as alone:
                    self._fail(j, alone)
            return
        start = 0
        for j in live:
            self._answer(j, out[start : start + len(j.sentences)])
            start += len(j.sentences)

    async def _call(self, sentences: list[Source], like: _Job) -> list[Translation]:
        call = functools.partial(
            self.translator.translate,
            sentences,
            beam=like.beam,
            nbest=like.nbest,
            batch_size=len(sentences),  # the batch is formed already: one search
            progress=False,
            with_heads=like.heads,
        )
        out = await asyncio.get_running_loop().run_in_executor(self._executor, call)
        self.counters.batches += 1
        return out

    @staticmethod
    def _answer(job: _Job, out: list[Translation]) -> None:
        if not job.future.done():
            job.future.set_result(out)

    @staticmethod
    def _fail(job: _Job, error: Exception) -> None:
        """Answered as a 500 to this caller; the server goes on."""
        log.error("decoding %d sentence(s) failed: %r", len(job.sentences), error)
        if not job.future.done():
            job.future.set_exception(error)
