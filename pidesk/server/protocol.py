"""The HTTP protocol the host listens with: uvicorn's h11, plus a first-byte deadline.

uvicorn starts its keep-alive timer only after a first response, so a
connection that never sends a byte would hold a file descriptor forever; enough
of them lock every client out. Here a connection that has sent nothing within
``FIRST_BYTE_TIMEOUT`` seconds is closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

FIRST_BYTE_TIMEOUT = 5.0


class ReapingH11Protocol(H11Protocol):
    _first_byte: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._first_byte = self.loop.call_later(FIRST_BYTE_TIMEOUT, self._reap_silent)

    def data_received(self, data: bytes) -> None:
        self._cancel_deadline()
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def _cancel_deadline(self) -> None:
        if self._first_byte is not None:
            self._first_byte.cancel()
            self._first_byte = None

    def _reap_silent(self) -> None:
        self._first_byte = None
        self.transport.close()
