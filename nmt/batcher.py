"""Micro-batching for `nmt serve`: the sentences of requests that arrive within a few
milliseconds of each other are decoded in one `Translator.translate` call.

The call runs on the batcher's own thread, so the event loop keeps accepting requests while a
batch decodes; they form the next batch. The search never lets one sentence change another's
result, so each caller gets exactly what it would have got alone.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nmt.limits import Limits

if TYPE_CHECKING:
    from nmt.translate import Translation, Translator

log = logging.getLogger("nmt.serve")


@dataclass
class _Job:
    sentences: list[str]
    beam: int
    nbest: int
    tokens: int
    future: asyncio.Future[list[Translation]]


@dataclass
class Counters:
    """What the server has done since it started (GET /health)."""

    requests: int = 0
    sentences: int = 0
    batches: int = 0
    errors: int = 0


class Batcher:
    """Decodes the sentences of requests that arrive close together in one call."""

    def __init__(self, translator: Translator, limits: Limits) -> None:
        self.translator = translator
        self.limits = limits
        self.counters = Counters()
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
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

    async def translate(self, sentences: list[str], *, beam: int, nbest: int) -> list[Translation]:
        tokens = sum(len(ids) + 1 for ids in self.translator.tokenizer.encode_src(sentences))
        job = _Job(sentences, beam, nbest, tokens, asyncio.get_running_loop().create_future())
        await self._queue.put(job)
        return await job.future

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
                if (job.beam, job.nbest) != (first.beam, first.nbest) or not fits:
                    waiting = job  # the first of the next group
                    break
                group.append(job)
                n, tokens = n + len(job.sentences), tokens + job.tokens
            await self._decode(group)

    async def _decode(self, group: list[_Job]) -> None:
        group = [j for j in group if not j.future.done()]  # callers gone: nothing to do
        if not group:
            return
        sentences = [s for j in group for s in j.sentences]
        call = functools.partial(
            self.translator.translate,
            sentences,
            beam=group[0].beam,
            nbest=group[0].nbest,
            progress=False,
        )
        try:
            out = await asyncio.get_running_loop().run_in_executor(self._executor, call)
        except Exception as e:  # answered as a 500 to these callers; the server goes on
            log.exception("decoding %d sentences failed", len(sentences))
            for j in group:
                if not j.future.done():
                    j.future.set_exception(e)
            return
        self.counters.batches += 1
        start = 0
        for j in group:
            if not j.future.done():
                j.future.set_result(out[start : start + len(j.sentences)])
            start += len(j.sentences)
