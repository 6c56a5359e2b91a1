"""pidesk: a local agent host. See docs/architecture.md for the layers."""

__version__ = "0.1.0"
PROTOCOL_VERSION = 1
