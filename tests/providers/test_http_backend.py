"""Which HTTP layer a provider's requests take (docs/architecture.md "The HTTP layer"): pidesk's
own transport (``providers/transport.py``) for plain-http:// model servers, httpx's for https://
and proxies."""

from __future__ import annotations

from pathlib import Path

import pytest

from pidesk.config import HostConfig
from pidesk.core.errors import InvalidParams
from pidesk.providers.sdk import plain_http


def test_plain_http_base_urls_get_pidesks_transport_and_the_config_can_turn_it_off(tmp_path: Path) -> None:
    assert plain_http("http://127.0.0.1:11434/v1") and plain_http("HTTP://gpu-box:8000/v1")
    assert not plain_http("https://api.openai.com/v1")
    assert not plain_http(None)  # the vendor's default: https

    def lean(**environ: str) -> bool:
        return HostConfig.from_environ({"PIDESK_CONFIG": str(tmp_path / "none.toml"), **environ},
                                       data_dir=tmp_path).lean_http

    assert lean()
    assert lean(https_proxy="http://proxy:3128")  # not used for http://
    assert not lean(HTTP_PROXY="https://proxy:3129")  # httpx would go through it, maybe over TLS
    assert not lean(all_proxy="https://proxy:3129")
    assert not lean(PIDESK_HTTP_TRANSPORT="httpx")  # the way out, should a server need it
    (tmp_path / "httpx.toml").write_text('http_transport = "httpx"\n')
    assert not lean(PIDESK_CONFIG=str(tmp_path / "httpx.toml"))
    assert lean(PIDESK_CONFIG=str(tmp_path / "httpx.toml"), PIDESK_HTTP_TRANSPORT="pidesk")  # env over file


def test_an_unknown_http_transport_is_refused_naming_where_it_was_set(tmp_path: Path) -> None:
    """"aiohttp" among them: the config file's template named it for a day (docs/architecture.md)."""
    def refusal(**environ: str) -> str:
        with pytest.raises(InvalidParams) as refused:
            HostConfig.from_environ({"PIDESK_CONFIG": str(tmp_path / "none.toml"), **environ}, data_dir=tmp_path)
        return refused.value.message

    assert refusal(PIDESK_HTTP_TRANSPORT="aiohttp") == 'PIDESK_HTTP_TRANSPORT = \'aiohttp\': it takes "pidesk" or "httpx"'
    (tmp_path / "bad.toml").write_text("http_transport = 3\n")
    assert refusal(PIDESK_CONFIG=str(tmp_path / "bad.toml")) == \
        'http_transport in the config file = 3: it takes "pidesk" or "httpx"'


def test_a_provider_uses_pidesks_transport_for_plain_http_unless_the_config_says_not_to() -> None:
    from pidesk.cli.models import make_provider

    local = {"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1", "ANTHROPIC_API_KEY": "k",
             "ANTHROPIC_BASE_URL": "http://127.0.0.1:8080"}
    for model in ("openai/m", "anthropic/m"):
        assert getattr(make_provider(model, local), "lean_transport")
        assert not getattr(make_provider(model, local, lean_http=False), "lean_transport")
    remote = {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "https://api.openai.com/v1"}
    assert not getattr(make_provider("openai/m", remote), "lean_transport")


def test_a_plain_http_client_has_nothing_that_would_speak_tls() -> None:
    """Its requests all go over pidesk's transport, which refuses an https:// URL (a redirect) instead
    of sending it in the clear (tests/providers/test_transport.py); building it loads no TLS trust
    (the SDK's CA bundle, 20–60 ms that would sit on the first request's path)."""
    from pidesk.cli.models import make_provider
    from pidesk.providers.transport import PlainHttpTransport

    provider = make_provider("openai/m", {"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1"})
    client, _ = provider._connect()  # type: ignore[attr-defined]
    assert isinstance(client._client._transport, PlainHttpTransport)
    assert client._client._mounts == {}  # no proxy transport beside it (lean_http is off when one is named)
