"""Build data directories in bulk, byte-for-byte in the store's own formats.

The builders write what ``Store.create_session`` + ``Store.append_message`` would
have left behind, only faster: transcripts through ``transcripts.encode_line``
(``HeaderLine`` then one ``MessageLine`` per message), index rows through
``repo.insert_session`` / ``repo.insert_message_rows`` inside big transactions,
with each session's watermark (``last_seq``, ``indexed_bytes``) equal to its
transcript, so a boot has nothing to repair. Turns, pending approvals and
permission requests go through ``repo`` too. ``verify`` proves the result is
what the store would have written: a fresh ``Store.reconcile`` must report
nothing, and pages read through the index must equal the transcript.

Ids are random hex as in production (``new_id``), drawn from a seeded generator
so a dataset is reproducible; timestamps are ISO-8601 like ``now_iso``.

Big datasets are cached under ``bench/out/cache/`` keyed by their parameters,
``FORMAT`` (bump it when the builder changes) and the source of the modules that
define the on-disk formats (records, transcripts, migrations), so a format change
rebuilds them; a cache entry counts only once its ``complete.json`` marker exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import harness

from pidesk.core.modes import (
    ApprovalStatus,
    ExecutionState,
    Mode,
    PermissionMode,
    PermissionStatus,
    PlanKind,
    PlanState,
    SessionStatus,
    TurnOrigin,
    TurnReason,
)
from pidesk.core.records import (
    Block,
    Message,
    PermissionRequest,
    PlanApproval,
    Session,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from pidesk.ids import iso
from pidesk.store import BootReport, Store, migrations, repo, transcripts
from pidesk.store.artifacts import sha256_of
from pidesk.core import records
from pidesk.store.transcripts import HeaderLine, as_line, encode_line

FORMAT = 2
EPOCH = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)
SESSIONS_PER_TX = 500


class Ids:
    """``new_id``-shaped ids (prefix + 16 hex) from a seeded generator."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def __call__(self, prefix: str) -> str:
        return f"{prefix}_{self._rng.getrandbits(64):016x}"


def turn_messages(session_id: str, turn_id: str, first_seq: int, ids: Ids, moment: datetime) -> list[Message]:
    """One ordinary turn, four messages averaging ~300 bytes a transcript line:
    a prompt, a tool call, its result, the answer."""
    n = first_seq
    blocks: list[tuple[str, list[Block]]] = [
        ("user", [TextBlock(text=f"Look at src/module_{n % 97}.py and tell me why test_{n % 13} fails on CI.")]),
        ("assistant", [
            TextBlock(text="Let me read the module first."),
            ToolCallBlock(id=f"call_{n}", name="Read", args={"path": f"src/module_{n % 97}.py"}),
        ]),
        ("tool", [ToolResultBlock(
            tool_call_id=f"call_{n}", name="Read", ok=True,
            output="def handler(event):\n    value = event['value']\n    return value * 2  # doubled\n",
        )]),
        ("assistant", [TextBlock(
            text=f"test_{n % 13} passes a string where handler expects a number; coerce it with int() first.",
        )]),
    ]
    return [
        Message(
            id=ids("m"), session_id=session_id, turn_id=turn_id, seq=first_seq + i, role=role, content=content,
            created_at=iso(moment + timedelta(milliseconds=250 * i)),
        )
        for i, (role, content) in enumerate(blocks)
    ]


@dataclass(frozen=True)
class SessionPlan:
    """What one session of a dataset holds beyond its messages."""

    mode: Mode = Mode.AGENT
    status: SessionStatus = SessionStatus.IDLE
    running_turn: bool = False  # the last turn is still running
    pending_approval: bool = False  # ... and submitted a plan that waits for the user
    pending_permission: bool = False  # ... or asked for a permission that waits
    from_queue: bool = False  # ... was started from a queue entry
    entry_left: bool = False  # ... whose entry the crash left queued, though its prompt line landed


def build(
    data_dir: Path,
    sessions: int,
    messages_per_session: int,
    *,
    seed: int = 1,
    project: Path | None = None,
    plan: Callable[[int], SessionPlan] = lambda _: SessionPlan(),
    progress: Callable[[str], None] = lambda _: None,
) -> None:
    """Write ``sessions`` sessions of ``messages_per_session`` messages (whole turns of 4) into ``data_dir``."""
    ids = Ids(seed)
    store = Store(data_dir)
    try:
        store.db.conn.execute("PRAGMA cache_size = -262144")  # 256 MiB while building; this connection only
        for start in range(0, sessions, SESSIONS_PER_TX):
            with store.db.tx() as db:
                for index in range(start, min(start + SESSIONS_PER_TX, sessions)):
                    _build_session(db, store.transcripts.path, ids, index, messages_per_session, project, plan(index))
            progress(f"{min(start + SESSIONS_PER_TX, sessions)}/{sessions} sessions")
        store.db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        store.close()


def _build_session(
    db: sqlite3.Connection, path_of: Callable[[str], Path], ids: Ids, index: int, count: int, project: Path | None,
    plan: SessionPlan,
) -> None:
    session_id = ids("s")
    created = EPOCH + timedelta(minutes=index)
    root = str(project) if project is not None else f"/scratch/{session_id}"
    turns = max(1, -(-count // 4)) if count else 0
    header = HeaderLine(
        id=session_id, title=f"Session {index}", project_path=str(project) if project else None, root=root,
        mode=plan.mode.value, created_at=iso(created), forked_from=None,
    )
    chunks = [encode_line(header)]
    offset = len(chunks[0])
    rows: list[tuple[str, str, str | None, int, str, int, int, str]] = []
    turn_rows: list[tuple[str, datetime, bool]] = []
    seq = 1
    for t in range(turns):
        turn_id = ids("t")
        moment = created + timedelta(seconds=30 * t)
        last = t == turns - 1
        turn_rows.append((turn_id, moment, last and plan.running_turn))
        for message in turn_messages(session_id, turn_id, seq, ids, moment)[: count - seq + 1]:
            data = encode_line(as_line(message))
            rows.append((message.id, session_id, turn_id, message.seq, message.role, offset, len(data),
                         message.created_at))
            chunks.append(data)
            offset += len(data)
        seq += 4
    path_of(session_id).write_bytes(b"".join(chunks))
    current_turn = turn_rows[-1][0] if plan.running_turn and turn_rows else None
    session = Session(
        id=session_id, title=header.title, project_path=header.project_path, root=root, mode=plan.mode,
        permission_mode=PermissionMode.ASK, status=plan.status,
        plan_state=PlanState.PLANNING if plan.mode.is_contract else PlanState.INACTIVE,
        current_turn_id=current_turn, forked_from=None, created_at=iso(created), updated_at=iso(created),
    )
    repo.insert_session(db, session, last_seq=rows[-1][3] if rows else 0, indexed_bytes=offset)
    repo.insert_message_rows(db, rows)
    for turn_id, moment, running in turn_rows:
        entry = None
        if running and plan.from_queue:
            entry = repo.queue_push(db, session_id, "run the tests again", []).id if plan.entry_left else ids("q")
        repo.insert_turn(db, turn_id, session_id, TurnOrigin.INTERACTIVE, None, queue_entry=entry)
        if not running:
            repo.end_turn_row(db, turn_id, TurnReason.COMPLETED, None)
    if current_turn is not None and plan.pending_approval:
        assert project is not None, "a pending approval needs a project"
        markdown = f"# Plan {index}\n\n1. Read the failing test.\n2. Fix the handler.\n".encode()
        artifact = f".pi/plan/20250106T090000Z-plan-{index}.md"
        (project / artifact).parent.mkdir(parents=True, exist_ok=True)
        (project / artifact).write_bytes(markdown)
        repo.insert_approval(db, PlanApproval(
            id=ids("pa"), kind=PlanKind.PLAN, session_id=session_id, turn_id=current_turn,
            tool_call_id=f"call_{index}", title=f"Plan {index}", question="Proceed?", criteria=None,
            artifact_path=artifact, artifact_sha256=sha256_of(markdown),
            artifact_size=len(markdown), status=ApprovalStatus.PENDING,
            deadline=iso(created + timedelta(minutes=30)), permission_mode=None, execution_id=None,
            execution_state=ExecutionState.NONE, revises=None, feedback=None, created_at=iso(created),
            resolved_at=None,
        ))
    if current_turn is not None and plan.pending_permission:
        repo.insert_request(db, PermissionRequest(
            id=ids("p"), session_id=session_id, turn_id=current_turn, tool_call_id=f"call_{index}", tool="Bash",
            args={"command": "make test"}, status=PermissionStatus.PENDING, created_at=iso(created),
            resolved_at=None,
        ))


def verify(data_dir: Path, samples: int = 3) -> BootReport:
    """Reconcile a fresh Store over the dataset (must find nothing) and decode a few pages."""
    store = Store(data_dir)
    try:
        report = store.reconcile()
        if report != BootReport():
            raise SystemExit(f"dataset {data_dir} is not what the store would write: boot repaired {report}")
        with store.db.read() as db:
            marks = list(repo.session_watermarks(db).items())
        for session_id, (last_seq, _size) in marks[:: max(1, len(marks) // samples)][:samples]:
            page, _more = store.page(session_id, None, 50)
            whole = store.messages(session_id)
            if last_seq and (page[-1].seq != last_seq or page != whole[-len(page):]):
                raise SystemExit(f"dataset {data_dir}: session {session_id} pages disagree with its transcript")
        return report
    finally:
        store.close()


# ---- the cache ----------------------------------------------------------------------


def cached(name: str, params: dict[str, object], make: Callable[[Path], None]) -> Path:
    """The cached dataset for ``params``, built by ``make(data_dir)`` the first time.

    Building one removes the entries it supersedes: same name and parameters, older formats.
    """
    formats = hashlib.sha256(b"".join(Path(m.__file__ or "").read_bytes() for m in (records, transcripts, migrations)))
    key = {"format": FORMAT, "sources": formats.hexdigest()[:16], "params": params}
    text = json.dumps(key, sort_keys=True)
    entry = harness.OUT / "cache" / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    marker = entry / "complete.json"
    if marker.exists():
        return entry
    for other in entry.parent.glob(f"{name}-*"):
        if other != entry and _params_of(other) in (params, None):
            shutil.rmtree(other)  # stale, or an interrupted build
    entry.mkdir(parents=True)
    make(entry)
    os.sync()
    marker.write_text(text + "\n")
    return entry


def _params_of(entry: Path) -> object:
    try:
        return json.loads((entry / "complete.json").read_text()).get("params")
    except (OSError, ValueError, AttributeError):
        return None


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
