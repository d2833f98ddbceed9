"""uvicorn's HTTP/1.1 protocol with a deadline for a request's headers (slowloris).

uvicorn closes a keep-alive connection that stays idle, but not one that sends a request's
headers a byte at a time, or opens and says nothing: each holds a connection, and a few
hundred of them hold them all. `GuardedH11Protocol` closes a connection whose request
headers are not complete within `header_seconds` of its first byte (or of connecting). The
body has its own deadline in the app (`nmt.serve`), where it is read.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


def guarded_protocol(header_seconds: float) -> type[H11Protocol]:
    """The protocol class for `uvicorn.Config(http=...)`, with its header deadline."""

    class GuardedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self.cycle is None or self.cycle.response_complete:
                self._arm()  # bytes of a new request: its headers are on the clock
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # the headers are in: the app reads the body

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._deadline is None:
                self._deadline = self.loop.call_later(header_seconds, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if self.cycle is None or self.cycle.response_complete:
                self.transport.close()

    return GuardedH11Protocol
