"""The authority: sessions, turns, queue, approvals, permissions, executions, recovery."""

from pidesk.host.host import METHODS, Host

__all__ = ["METHODS", "Host"]
