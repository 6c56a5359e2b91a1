"""Every byte on disk: the SQLite index, JSONL transcripts, plan artifacts."""

from pidesk.store.store import BootReport, Store

__all__ = ["BootReport", "Store"]
