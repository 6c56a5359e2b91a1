"""Plugins: MCP tool servers the model may call in Agent mode, and entry-point event hooks.

``McpTools`` (``mcp_tools``) spawns the ``[plugins.mcp.<name>]`` servers of the
config file and offers their tools as ``mcp__<server>__<tool>`` with the risk
the user declared; ``core.policy.decide(..., plugin_risk=...)`` judges each call.
``EventHooks`` (``hooks``) delivers host events to ``pidesk.plugins`` entry points.
Import the submodules directly: ``mcp_tools`` loads the MCP SDK (about 0.8 s), so
the host imports it only when the config names a server.
"""
