"""Plugins: MCP tool servers the model may call in Agent mode, and entry-point event hooks.

``McpTools`` (``mcp_tools``) connects the ``[plugins.mcp.<name>]`` servers of the
config file (stdio processes or Streamable HTTP URLs), in the background of every
entry point, and offers their tools as ``mcp__<server>__<tool>`` with the risk
the user declared or, failing that, the one the tool's own hints give;
``core.policy.decide(..., plugin_risk=...)`` judges each call.
``EventHooks`` (``hooks``) delivers host events to ``pidesk.plugins`` entry points.
Import the submodules directly: ``mcp_tools`` loads the MCP SDK (about 0.8 s), so
the host imports it only when the config names a server.
"""
