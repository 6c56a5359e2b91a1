"""What the vendor tests share: the mock vendor server, a recorded sleep, and both transports.

Every test that talks to the mock vendor runs twice: over pidesk's plain-HTTP transport (what a
loopback ``http://`` base URL gets, ``providers/transport.py``) and over httpx's default transport
(what ``https://`` addresses and proxied clients get), so both are held to the same behaviour."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

import pidesk.providers.sdk as sdk_module
from tests.providers.mock_vendors import MockVendor, RecordedSleep


@pytest.fixture(params=["plain-http", "httpx-default"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "httpx-default":
        monkeypatch.setattr(sdk_module, "plain_http", lambda base_url: False)
    return str(request.param)


@pytest_asyncio.fixture
async def vendor(transport: str) -> AsyncIterator[MockVendor]:
    async with MockVendor() as server:
        yield server


@pytest.fixture
def sleep() -> RecordedSleep:
    return RecordedSleep()
