"""What the vendor providers share: configuration, the client (built once, off the loop), the
request path (the SDK sends, pidesk encodes the body and decodes the events), the response
loop, the retry driver, and a key that never shows."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from typing import Any, Protocol

import msgspec

from pidesk.providers.base import ModelRequest, StreamEvent, TextDelta
from pidesk.providers.retry import (
    DEFAULT_MAX_RETRIES,
    Failure,
    RetryPolicy,
    SdkErrors,
    Sleep,
    page_text,
    stream_with_retries,
)
from pidesk.providers.sse import Events

log = logging.getLogger(__name__)
CONNECT_TIMEOUT = 5.0  # seconds to open a connection (the SDKs' own default)
_encode = msgspec.json.Encoder().encode


def plain_http(base_url: str | None) -> bool:
    """Nothing a client of this base URL sends needs TLS (whether a proxy is in the way, or the
    user asked for httpx's own transport, is the config's to say: ``HostConfig.lean_http``)."""
    return base_url is not None and base_url.lower().startswith("http://")


class SdkProvider(ABC):
    """A provider over a vendor SDK: subclasses name the SDK, its endpoint and the struct its
    events decode into, build the request body, and turn one streamed response into events
    (``_attempt``)."""

    vendor = ""
    path = ""  # the streaming endpoint, under the client's base URL
    decoder: msgspec.json.Decoder[Any]
    # the format ends a complete stream with ``data: [DONE]`` (Chat Completions); a reply that is ``whole``
    # without it (its finish reason and usage came) is taken, as the official SDK takes it
    ends_with_done = False

    def __init__(self, model: str, *, api_key: str, base_url: str | None, lean_http: bool = True,
                 max_retries: int = DEFAULT_MAX_RETRIES, sleep: Sleep = asyncio.sleep) -> None:
        self.name = f"{self.vendor}/{model}"
        self.model = model
        self._api_key = api_key
        self._base_url = base_url
        self._lean_http = lean_http  # a plain-http:// base URL may use pidesk's transport (HostConfig.lean_http)
        self._policy = RetryPolicy(max_retries)
        self._sleep = sleep
        self._client: Any = None
        self._errors: SdkErrors | None = None
        self._connecting = threading.Lock()  # a warm-up thread and the first request may race

    def configure(self, policy: RetryPolicy) -> None:
        """Take the host's retry budget, Retry-After cap and stream idle time (``HostConfig.retry``),
        before the first request: the idle time is the client's read timeout."""
        self._policy = policy

    def __repr__(self) -> str:  # never the key
        return f"{type(self).__name__}({self.model!r}, base_url={self._base_url!r})"

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def warm_up(self) -> None:
        """Import the SDK and build the client now (blocking: call it from a worker thread), so
        no request waits for it. A failure is left for the first request to report."""
        try:
            self._connect()
            # What httpx loads on its first request (~20 ms), loaded here rather than on the loop.
            import anyio._backends._asyncio  # noqa: F401
            # The OpenAI SDK's first request names the OS with platform.platform(), which runs `uname -p`
            # (on a worker thread it waits for): 6-8 ms here. The standard library keeps the answer.
            import platform

            platform.platform()
        except Exception:
            log.debug("warming up the %s client failed; the first request will say why", self.vendor, exc_info=True)

    async def ready(self) -> None:
        """Return once the SDK is imported and the client built: at once after the first time. For work
        that must not compete with the first request on a cold start (the import is most of its wait).
        A failure is left for the request to report."""
        with contextlib.suppress(Exception):
            await self._connected()

    @property
    def lean_transport(self) -> bool:
        """Requests go over pidesk's own HTTP transport (``providers/transport.py``) rather than
        httpx's: a plain-http:// base URL (a local model server, where the HTTP layer is most of a
        tool round trip's cost) and ``lean_http`` (the config's say: no proxy in the way, no
        opt-out). docs/architecture.md "The HTTP layer" has the measurements that chose it."""
        return self._lean_http and plain_http(self._base_url)

    async def _connected(self) -> tuple[Any, SdkErrors]:
        """The client, built off the event loop the first time (importing an SDK takes ~1 s)."""
        if self._client is None or self._errors is None:
            return await asyncio.to_thread(self._connect)
        return self._client, self._errors

    def _connect(self) -> tuple[Any, SdkErrors]:
        with self._connecting:
            if self._client is None or self._errors is None:
                import anyio
                import httpx2

                sdk, client_class = self._sdk()
                options: dict[str, Any] = {}
                if self.lean_transport:
                    from pidesk.providers.transport import PlainHttpTransport

                    options["http_client"] = sdk.DefaultAsyncHttpxClient(transport=PlainHttpTransport())
                idle = self._policy.idle_timeout  # no byte for this long, before the head or in the body: broken
                self._client = client_class(api_key=self._api_key, base_url=self._base_url, max_retries=0,
                                            timeout=httpx2.Timeout(idle, connect=min(idle, CONNECT_TIMEOUT)), **options)
                self._errors = SdkErrors(
                    self.vendor, sdk.APIStatusError, sdk.APIConnectionError, sdk.APIError,
                    (httpx2.HTTPError, anyio.EndOfStream, anyio.BrokenResourceError),
                    idle=(httpx2.ReadTimeout,), url=str(self._client.base_url).rstrip("/"), idle_timeout=idle,
                )
            return self._client, self._errors

    async def _start(self, request: ModelRequest) -> tuple[Any, SdkErrors] | Failure:
        """Open one streaming request: (the SDK's stream, its error mapper), or why it failed."""
        try:
            client, errors = await self._connected()
        except Exception as exc:  # e.g. an unusable base URL
            return Failure("fatal", f"cannot set up the {self.vendor} client: {exc}")
        params = self._params(request)  # an exception here is a PROVIDER_ERROR (the retry driver's rule)
        try:
            return await self._create(client, params), errors
        except Exception as exc:
            return errors.request_failure(exc)

    @abstractmethod
    def _sdk(self) -> tuple[Any, Any]:
        """The vendor's SDK module and its async client class (imported here, lazily)."""

    @abstractmethod
    def _params(self, request: ModelRequest) -> dict[str, Any]:
        """The vendor's request body for ``request``."""

    async def _create(self, client: Any, params: dict[str, Any]) -> Events[Any]:
        """Send the body and open its event stream. ``client.post`` with ``content`` is the SDK's
        documented way to send a body it need not look at: the vendor methods would walk the
        whole history through their type-directed transform and the json module, where msgspec
        encodes this wire-format body in a tenth of the time. The SDK still builds the headers,
        sends the request and raises its errors for a failed status."""
        import httpx2  # the SDK's HTTP client, loaded with it

        response = await client.post(self.path, cast_to=httpx2.Response, content=_encode(params), stream=True)
        assert self._errors is not None  # set with the client
        return Events(response, self.decoder, self._errors.api)

    def stream(self, request: ModelRequest) -> AsyncGenerator[StreamEvent, None]:
        return stream_with_retries(lambda: self._attempt(request), self._policy, self._sleep, secret=self._api_key)

    async def _attempt(self, request: ModelRequest) -> AsyncGenerator[StreamEvent | Failure, None]:
        """One request's events: text as it arrives, then the assembled tool calls, usage and
        ``Done``; or a ``Failure`` the retry driver judges."""
        started = await self._start(request)
        if isinstance(started, Failure):
            yield started
            return
        stream, errors = started
        reply = self._reply()
        try:
            async with stream:
                if stream.content_type.startswith("application/json"):
                    yield _not_a_stream(self.vendor, stream.content_type, await stream.head())
                    return
                async for event in stream:
                    text = reply.feed(event)
                    if reply.out:  # thinking, as it streams (before the text: it came first)
                        for other in reply.out:
                            yield other
                        reply.out.clear()
                    if text:
                        yield TextDelta(text)
                    if reply.last:
                        await stream.skip_rest()
                        break
        except Exception as exc:
            yield errors.stream_failure(exc)
            return
        if not reply.complete:
            yield Failure("broken", f"the {self.vendor} stream ended before the response was finished")
            return
        if self.ends_with_done and not stream.done and not getattr(reply, "whole", False):
            yield Failure("broken", f"the {self.vendor} stream ended without data: [DONE] or usage after its "
                                    "finish reason (the answer may be cut short)")
            return
        for event in reply.finish():
            yield event

    @abstractmethod
    def _reply(self) -> Reply:
        """A new assembler for one response's events."""


def _not_a_stream(vendor: str, content_type: str, body: bytes) -> Failure:
    """A streaming request answered with one JSON body: the server (or a proxy) does not stream. Not
    retried: asking again gets the same."""
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    said = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
    return Failure("fatal", f"the {vendor} server answered a streaming request with plain JSON ({content_type}), "
                            "not a stream of events: it does not stream, or a proxy in between buffers it"
                            + (f'; it said "{page_text(str(said))}"' if said else ""))


class Reply(Protocol):
    """One response being assembled from its decoded events."""

    out: list[StreamEvent]  # events besides text that ``feed`` produced, yielded (and cleared) after it

    @property
    def complete(self) -> bool:
        """The vendor said the response is finished (a stream that ends before broke off)."""

    @property
    def last(self) -> bool:
        """Nothing pidesk reads follows the event just fed: stop reading."""

    def feed(self, event: Any) -> str:
        """Take one event; returns its text (possibly empty)."""

    def finish(self) -> list[StreamEvent]:
        """The tool calls, usage and ``Done``, once the response is complete."""
