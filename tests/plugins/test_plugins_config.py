"""load_mcp_config: the [plugins.mcp.<name>] tables of the config file."""

from __future__ import annotations

import tomllib

import pytest

from pidesk.core.errors import Code, InvalidParams
from pidesk.core.policy import PluginRisk
from pidesk.plugins.mcp_config import McpServerConfig, load_mcp_config

VALID = """
model = "demo"

[plugins.mcp.github]
command = ["npx", "-y", "@modelcontextprotocol/server-github"]
risk = "medium"
env = { GITHUB_TOKEN = "t0ken" }

[plugins.mcp.notes-db]
command = ["uvx", "notes-mcp"]
risk = "low"
enabled = false
"""


def test_reads_every_server_table_in_order() -> None:
    assert load_mcp_config(tomllib.loads(VALID)) == [
        McpServerConfig("github", ["npx", "-y", "@modelcontextprotocol/server-github"], {"GITHUB_TOKEN": "t0ken"},
                        PluginRisk.MEDIUM),
        McpServerConfig("notes-db", ["uvx", "notes-mcp"], None, PluginRisk.LOW, enabled=False),
    ]


def test_a_server_may_set_its_call_deadline_which_defaults_to_120_seconds() -> None:
    """Authority hole 3: a plugin tool call had no deadline; each server now has one (``timeout``, seconds)."""
    short, default = load_mcp_config(tomllib.loads(
        '[plugins.mcp.a]\ncommand = ["x"]\nrisk = "low"\ntimeout = 2.5\n'
        '[plugins.mcp.b]\ncommand = ["x"]\nrisk = "low"\n'
    ))
    assert (short.timeout, default.timeout) == (2.5, 120.0)


def test_no_plugins_section_means_no_servers() -> None:
    assert load_mcp_config({}) == []
    assert load_mcp_config({"plugins": {}}) == []


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('command = ["x"]\nrisk = "extreme"', r"\[plugins.mcp.srv\]: risk must be one of .*got 'extreme'"),
        ('command = ["x"]\nrisk = 2', r"\[plugins.mcp.srv\]: risk must be one of .*got 2"),
        ('command = "uvx my-server"\nrisk = "low"', r"command must be a list of strings, e.g. command = \[\"uvx\", \"my-server\"\]"),
        ('command = []\nrisk = "low"', r"command must be a non-empty list"),
        ('risk = "low"', r"command must be a non-empty list"),
        ('command = ["x", 1]\nrisk = "low"', r"command must be a non-empty list of non-empty strings"),
        ('command = ["x"]\nrisk = "low"\nenv = { N = 1 }', r"env must be a table of string values"),
        ('command = ["x"]\nrisk = "low"\nenabled = "yes"', r"enabled must be true or false"),
        ('command = ["x"]\nrisk = "low"\nrisks = "high"', r"unknown key\(s\) risks: remove or correct them"),
        ('command = ["x"]\nurl = "http://127.0.0.1:1/mcp"', r"command and url both given"),
        ('url = "ftp://example.com/mcp"', r"url must be an http:// or https:// address"),
        ('url = "http://127.0.0.1:1/mcp"\nenv = { A = "b" }', r"env is for stdio servers"),
        ('command = ["x"]\nheaders = { A = "b" }', r"headers are for HTTP servers"),
        ('url = "http://127.0.0.1:1/mcp"\nheaders = { A = 1 }', r"headers must be a table of string values"),
        ('command = ["x"]\nrisk = "low"\ntimeout = 0', r"timeout must be a positive number of seconds .*got 0"),
        ('command = ["x"]\nrisk = "low"\ntimeout = -5', r"timeout must be a positive number of seconds .*got -5"),
        ('command = ["x"]\nrisk = "low"\ntimeout = "2m"', r"timeout must be a positive number of seconds .*got '2m'"),
        ('command = ["x"]\nrisk = "low"\ntimeout = inf', r"timeout must be a positive number of seconds .*got inf"),
        ('command = ["x"]\nrisk = "low"\ntimeout = true', r"timeout must be a positive number of seconds .*got True"),
    ],
)
def test_a_bad_table_is_a_clear_error_naming_the_server(table: str, message: str) -> None:
    with pytest.raises(InvalidParams, match=message) as raised:
        load_mcp_config(tomllib.loads(f"[plugins.mcp.srv]\n{table}\n"))
    assert raised.value.code is Code.INVALID_PARAMS
    assert "[plugins.mcp.srv]" in raised.value.message


@pytest.mark.parametrize("name", ["a__b", "_a", "a_", "a.b", "a b"])
def test_server_names_must_make_unambiguous_tool_names(name: str) -> None:
    with pytest.raises(InvalidParams, match="server name may hold only"):
        load_mcp_config({"plugins": {"mcp": {name: {"command": ["x"], "risk": "low"}}}})


def test_plugins_mcp_must_hold_tables() -> None:
    with pytest.raises(InvalidParams, match=r"\[plugins.mcp\] must be a table"):
        load_mcp_config({"plugins": {"mcp": ["x"]}})
    with pytest.raises(InvalidParams, match=r"\[plugins.mcp.x\]: must be a table"):
        load_mcp_config({"plugins": {"mcp": {"x": "npx server"}}})


def test_risk_may_be_left_to_the_tools_hints_and_a_server_may_be_reached_over_http() -> None:
    """Issue 19 items 6 and 7: ``url`` (+ ``headers``) is a Streamable HTTP server, and ``risk`` is optional."""
    [http] = load_mcp_config(tomllib.loads(
        '[plugins.mcp.docs]\nurl = "http://127.0.0.1:8000/mcp"\nheaders = { Authorization = "Bearer ${TOKEN}" }\n'
    ))
    assert (http.url, http.headers, http.command, http.risk) == (
        "http://127.0.0.1:8000/mcp", {"Authorization": "Bearer ${TOKEN}"}, [], None)
    assert "TOKEN" not in repr(http)  # header values may be secrets


def test_a_bad_table_names_the_config_file() -> None:
    with pytest.raises(InvalidParams, match=r"^config file /x/config.toml \[plugins.mcp.srv\]: url must be"):
        load_mcp_config(tomllib.loads('[plugins.mcp.srv]\nurl = 3\n'), "config file /x/config.toml")
