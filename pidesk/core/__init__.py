"""Pure rules: modes, permission policy, state transitions, error codes.

Nothing in this package performs I/O or touches asyncio, sqlite3, os or time;
it is checked with ``mypy --strict`` and tested exhaustively.
"""
