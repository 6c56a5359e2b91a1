"""What the vendor providers share: configuration, the retry loop, a key that never shows."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from pidesk.providers.base import ModelRequest, StreamEvent
from pidesk.providers.retry import DEFAULT_MAX_RETRIES, Failure, RetryPolicy, SdkErrors, Sleep, stream_with_retries


class SdkProvider:
    """A provider over a vendor SDK; subclasses implement ``_attempt`` (one request) and ``warm_up``."""

    vendor = ""

    def __init__(self, model: str, *, api_key: str, base_url: str | None,
                 max_retries: int = DEFAULT_MAX_RETRIES, sleep: Sleep = asyncio.sleep) -> None:
        self.name = f"{self.vendor}/{model}"
        self.model = model
        self._api_key = api_key
        self._base_url = base_url
        self._policy = RetryPolicy(max_retries)
        self._sleep = sleep
        self._client: Any = None
        self._errors: SdkErrors | None = None

    def __repr__(self) -> str:  # never the key
        return f"{type(self).__name__}({self.model!r}, base_url={self._base_url!r})"

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _connected(self) -> tuple[Any, SdkErrors]:
        """The client, built off the event loop the first time (importing an SDK takes ~1 s)."""
        if self._client is None or self._errors is None:
            return await asyncio.to_thread(self._connect)
        return self._client, self._errors

    def _connect(self) -> tuple[Any, SdkErrors]:
        raise NotImplementedError

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        return stream_with_retries(lambda: self._attempt(request), self._policy, self._sleep, secret=self._api_key)

    def _attempt(self, request: ModelRequest) -> AsyncGenerator[StreamEvent | Failure, None]:
        raise NotImplementedError
