"""The agent loop: provider stream -> assistant message -> tool calls -> host.authorize -> results."""
