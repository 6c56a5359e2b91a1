"""Checkpoints (issue 17): when the workspace is recorded, what each turn changed, and reverts.

The store's ``ShadowRepo`` (``store/checkpoints.py``) does the recording; this
module decides when, and attributes:

- A checkpoint when each turn starts (``before_turn``: the turn's "before"
  state — what the root's watch saw change since the last checkpoint, the user's
  edits between turns included; a scan of every file only when the watch cannot
  vouch for its answer), and after each call of a tool that can change the workspace —
  Write, Edit, Bash, plugin tools, delegates' calls (``after_call``: the paths
  the root's watch saw change, or a Write's or Edit's file). Neither holds the
  turn up: both run as tasks, so the model request overlaps them, and only a
  tool call waits (``before_call``) for its turn's "before" state to be recorded
  first. Every git operation on one root runs under that root's
  ``asyncio.Lock`` (FIFO), so checkpoints are recorded in the order taken, and a
  ``session.revert`` or the next turn's checkpoint sees every checkpoint a
  finished turn started (a ``session.changes`` waits for a just-ended turn's
  list, which waits for them).
- A call checkpoint whose tree differs from the root's previous one is journaled
  as ``{k: "call", s, t, prev, tree}``. A turn's changes are, for the files its
  own calls changed (prev → tree of each), the diff from the turn's "before" tree
  to its last tree. Two sessions in one project share the root's journal: a
  file counts for the turn whose call's checkpoint first saw it change. When the
  turn ends (``turn_ended``) that list is worked out once and stored, and
  ``session.changes`` reads the stored lists (``host/changes.py``), never under
  the root's lock.
- A checkpoint never fails or blocks a turn. A failure (git missing, a full
  disk, a timeout) is audited ``checkpoint.failed`` on the turn (once per turn)
  and shown as the ``note`` of ``session.changes``; a root with too many files
  turns checkpoints off for it (``checkpoints.off``, audited once per session).
- A file over the size cap (10 MiB) is never recorded: a call checkpoint that saw
  one change journals it under ``big`` (``[path, status, size]``), and the turn's
  changes list it with ``tooLarge: true`` and a sentence for its diff. A turn's
  checkpoint journals the tracked files over the cap then (``held``): no tree
  holds their content at that point. A revert leaves both kinds as they are and
  names them in ``notRestored``.
- Retention (issue 33 §3): each session's last ``checkpoint_keep_turns`` turns made in the
  last ``checkpoint_keep_days`` days keep their checkpoints (``beyond_policy``); ``prune``
  forgets the rest on a root's first use in a process and every ``PRUNE_EVERY`` turns, in
  the background, under the root's lock and only while no turn of the root runs. Their
  stored lists stay (stored first when missing); their diffs and reverts say they were pruned.
- ``revert``: idle only — the session and every other session on the same root
  (``AGENT_BUSY``). Under the root's lock: a snapshot of now (so hand edits are
  reverted too, and can be restored), the restore, a snapshot of the result, the
  journal line ``{k: "revert", id, prev, tree}`` (synced) and the audit entry
  ``workspace.reverted``; then, outside the lock, its stored list. A revert is
  listed by ``session.changes`` under its id, which ``session.revert`` accepts:
  reverting it restores the state it replaced.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

from pidesk.core.errors import Code, Conflict, NotFound, PideskError
from pidesk.core.records import ToolCallBlock
from pidesk.host import validate
from pidesk.host.changes import ChangeLists
from pidesk.host.live import LiveTurn
from pidesk.host.parts import Parts
from pidesk.ids import iso, new_id, now_iso, utcnow
from pidesk.store import Store, repo
from pidesk.store.checkpoints import CheckpointError, JournalUnit, ShadowRepo, TooLarge
from pidesk.tools import workspace
from pidesk.tools.base import ToolFailure

log = logging.getLogger("pidesk.checkpoints")

CHANGING_TOOLS = frozenset({"Write", "Edit", "Bash"})
PRUNE_EVERY = 50  # turns of a root between two looks at its retention policy (and one at its first use)
RECHECK_S = 300.0  # a root too large to checkpoint is counted again by a turn starting this much later
PREVIEW_LIMIT = 1024 * 1024  # bytes of an existing file a permission preview reads
PREVIEW_LINES = 3000  # lines a side a permission preview diffs (~0.2 s of difflib at worst here)


@dataclass
class _Project:
    repo: ShadowRepo
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last: str | None = None  # the tree of the last checkpoint recorded
    off: str | None = None  # why checkpoints are off for this root
    off_since: float = 0.0  # time.monotonic() when they went off
    note: str | None = None  # the last failure, until a checkpoint succeeds
    # the call checkpoints waiting for the lock, by (session, turn): the paths they are to look at
    # (None: everywhere) — a later call of the same turn adds its paths to the waiting one
    waiting: dict[tuple[str, str], set[str] | None] = field(default_factory=dict)
    failed_turns: set[str] = field(default_factory=set)
    noted_sessions: set[str] = field(default_factory=set)
    turns: int = 0  # turns ended since its retention policy was last applied
    pruning: asyncio.Task[None] | None = None


_BY_STORE: weakref.WeakKeyDictionary[Store, Checkpoints] = weakref.WeakKeyDictionary()


def of(parts: Parts) -> Checkpoints:
    """The host's checkpoints (one per store, made on first use)."""
    found = _BY_STORE.get(parts.store)
    if found is None:
        found = _BY_STORE[parts.store] = Checkpoints(parts)
    return found


class Checkpoints:
    def __init__(self, parts: Parts) -> None:
        self.p = parts
        self.size_cap: int | None = None  # None: the store's defaults
        self.max_files: int | None = None
        self._projects: dict[Path, _Project] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._roots: dict[str, Path] = {}  # session id -> its root
        self._before: dict[str, asyncio.Task[None]] = {}  # turn id -> its "before" checkpoint, while it runs
        self._turn_tasks: dict[str, set[asyncio.Task[None]]] = {}  # turn id -> the checkpoints it started
        self.lists = ChangeLists(parts, self._project, self._track)

    def _project(self, root: Path) -> _Project:
        project = self._projects.pop(root, None)  # re-inserted last: the dict runs oldest use first
        if project is not None:
            self._projects[root] = project
        else:
            limits = {k: v for k, v in (("size_cap", self.size_cap), ("max_files", self.max_files)) if v is not None}
            shadow = ShadowRepo(self.p.store.data_dir, root, faults=self.p.store.faults, **limits)
            project = self._projects[root] = _Project(shadow)
            project.last = shadow.last_tree()
            project.turns = PRUNE_EVERY  # its first use in this process applies the retention policy
        return project

    # ---- hooks ------------------------------------------------------------------------

    def before_turn(self, live: LiveTurn) -> None:
        """Start recording the workspace as the turn finds it (in the background) once the
        model client is ready: on a cold start the SDK's import is what the first request waits for,
        and the scan's git processes and threads slowed it by ~90 ms (docs/benchmarks.md). Nothing
        of the turn can change the workspace meanwhile: a tool call waits for this checkpoint."""
        turn_id = live.turn_id
        task = self._spawn(live.session_id, turn_id, "turn", None)
        if task is not None:
            self._before[turn_id] = task
            task.add_done_callback(lambda _: self._before.pop(turn_id, None))

    async def before_call(self, live: LiveTurn) -> None:
        """Before a tool call runs: the turn's "before" state is recorded. Never raises but a cancellation."""
        task = self._before.get(live.turn_id)
        if task is not None:
            await asyncio.shield(task)

    def after_call(self, live: LiveTurn, call: ToolCallBlock) -> None:
        """After ``call``: record the workspace as it left it (in the background)."""
        plugins = self.p.plugins(live.session_id)
        if call.name in CHANGING_TOOLS or (plugins is not None and plugins.risk_of(call.name) is not None):
            self._spawn(live.session_id, live.turn_id, "call", self._named_paths(live.session_id, call))

    def _named_paths(self, session_id: str, call: ToolCallBlock) -> set[str] | None:
        """The file a Write or Edit names, relative to the root (None: any path may have changed)."""
        path = call.args.get("path")
        root = self._root(session_id)
        if call.name not in ("Write", "Edit") or not isinstance(path, str) or root is None:
            return None
        try:
            _target, rel = workspace.resolve(root, path)
        except ToolFailure:
            return None
        return {rel}

    def _root(self, session_id: str) -> Path | None:
        """A session's project root (a session keeps its root for life: asked of the store once)."""
        root = self._roots.get(session_id)
        if root is None:
            try:
                root = self._roots[session_id] = Path(self.p.session(session_id).root)
            except PideskError:
                return None
        return root

    def _spawn(self, session_id: str, turn_id: str, kind: str, paths: set[str] | None) -> asyncio.Task[None] | None:
        root = self._root(session_id)
        if root is None:
            return None
        project = self._project(root)
        if project.off is not None and kind == "turn" and time.monotonic() - project.off_since >= RECHECK_S:
            project.off = None  # files may have gone (or been ignored) since: count again
        if project.off is not None:
            self._note_off(project, session_id, turn_id)
            return None
        key = (session_id, turn_id)
        if kind == "call" and key in project.waiting:  # the waiting one looks at this call's paths too
            known = project.waiting[key]
            project.waiting[key] = None if known is None or paths is None else known | paths
            return None
        if kind == "call":
            project.waiting[key] = paths
        task = asyncio.create_task(self._record(project, session_id, turn_id, kind), name=f"checkpoint {turn_id}")
        self._track(task)
        self._turn_tasks.setdefault(turn_id, set()).add(task)
        return task

    def _track(self, task: asyncio.Task[None]) -> None:
        """A task ``close`` waits for."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _make_room(self, project: _Project) -> None:
        """Before a root not watched now starts its watch: unwatch the least recently checkpointed
        idle roots while the directories it watched last time (or wanted, when they did not fit)
        would pass the shared budget (``store/treewatch.py``). Every root shares one inotify
        instance, so any number of roots is watched while their directories fit; past that the
        roots used least stop watching, and their next checkpoint scans in full and starts again."""
        watch = project.repo.watch
        if watch.watching or not watch.available:
            return
        inotify = watch.inotify
        freed = 0
        victims = []
        for other in list(self._projects.values()):  # oldest use first
            if inotify.count - freed + watch.size < inotify.budget:
                break
            if other is not project and other.repo.watch.watching and not other.lock.locked():
                victims.append(other.repo)
                freed += other.repo.watch.size
        def unwatch() -> None:
            for shadow in victims:
                shadow.close()

        if victims:
            await asyncio.to_thread(unwatch)

    async def _record(self, project: _Project, session_id: str, turn_id: str, kind: str) -> None:
        if kind == "turn":
            ready = getattr(self.p.provider, "ready", None)  # (a vendor SDK's client: see before_turn)
            if callable(ready):
                await ready()
        await self._make_room(project)
        async with project.lock:
            paths = project.waiting.pop((session_id, turn_id), None) if kind == "call" else None
            if project.off is not None:
                return
            try:
                # a turn's "before" state too looks only where the watch saw change (the user's edits
                # between turns included); without a watch that can vouch, the scan covers the root
                tree = await project.repo.snapshot(sorted(paths) if paths is not None else None)
                skipped = project.repo.skipped
                if kind == "turn" or tree != project.last or skipped:
                    entry: dict[str, Any] = {"k": kind, "s": session_id, "t": turn_id, "tree": tree, "at": now_iso()}
                    if kind == "call":
                        entry["prev"] = project.last
                        if skipped:
                            entry["big"] = [[path, status, size] for path, (status, size) in sorted(skipped.items())]
                    elif project.repo.held:
                        entry["held"] = sorted(project.repo.held)
                    await asyncio.to_thread(project.repo.append, entry)
                    self.lists.journaled(turn_id, entry)
                project.last = tree
                project.note = None
            except TooLarge as exc:
                project.off = f"checkpoints are off for this project: {exc}"
                project.off_since = time.monotonic()
                self._note_off(project, session_id, turn_id)
            except Exception as exc:  # a checkpoint never fails the turn
                log.warning("checkpoint of %s failed: %s", project.repo.root, exc)
                project.note = f"a checkpoint failed: {exc}" + (
                    "" if isinstance(exc, CheckpointError) else " (check the data dir's disk)")
                if turn_id not in project.failed_turns:
                    project.failed_turns.add(turn_id)
                    self._audit("checkpoint.failed", session_id, turn_id, error=str(exc)[:500])

    def _note_off(self, project: _Project, session_id: str, turn_id: str) -> None:
        if session_id not in project.noted_sessions:
            project.noted_sessions.add(session_id)
            self._audit("checkpoints.off", session_id, turn_id, reason=project.off)

    def _audit(self, action: str, session_id: str, turn_id: str | None, **detail: Any) -> None:
        try:
            with self.p.store.db.tx() as db:
                repo.audit(db, action, session_id, turn_id, **detail)
        except Exception:
            log.exception("could not audit %s", action)

    async def close(self) -> None:
        """Let the checkpoints in flight finish (the store closes after this); stop the watches."""
        for _ in range(100):
            if not self._tasks:
                break
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        for project in self._projects.values():
            project.repo.close()

    # ---- session.changes ------------------------------------------------------------------

    def turn_ended(self, live: LiveTurn) -> None:
        """The turn has ended (completed, failed or aborted): its list of changes is stored once the
        checkpoints it started are recorded (``host/changes.py``), in the background."""
        recording = self._turn_tasks.pop(live.turn_id, set())
        root = self._root(live.session_id)
        if root is not None:
            self.lists.settle(live, root, recording)
            project = self._project(root)
            project.turns += 1
            if project.turns >= PRUNE_EVERY:
                self._prune_soon(project, root)

    # ---- retention --------------------------------------------------------------------------

    def policy(self) -> str:
        """The retention policy in words, naming its settings."""
        config = self.p.config
        return (f"checkpoint_keep_turns = {config.checkpoint_keep_turns}, "
                f"checkpoint_keep_days = {config.checkpoint_keep_days:g}")

    def _prune_soon(self, project: _Project, root: Path) -> None:
        """Apply the retention policy to ``root`` in the background, once its turns are idle."""
        config = self.p.config
        if project.pruning is not None or (config.checkpoint_keep_turns <= 0 and config.checkpoint_keep_days <= 0):
            return
        async def prune() -> None:
            await self.prune(root)

        task = asyncio.create_task(prune(), name=f"checkpoint retention {root}")
        project.pruning = task

        def done(_: asyncio.Task[None]) -> None:
            project.pruning = None

        task.add_done_callback(done)
        self._track(task)

    async def prune(self, root: Path) -> int:
        """Forget the checkpoints the retention policy no longer keeps (``checkpoint_keep_turns`` per
        session, made in the last ``checkpoint_keep_days``): their journal lines and the git objects only
        they reached. Under the root's lock, never while a turn of the root runs (then: at a later turn's
        end). A pruned turn keeps its stored list of files; its diffs and its revert are gone. Returns the
        turns and reverts pruned."""
        project = self._project(root)
        config = self.p.config
        if project.off is not None or self._root_busy(str(root)):
            return 0
        async with project.lock:
            if self._root_busy(str(root)):
                return 0
            project.turns = 0
            try:
                units = await asyncio.to_thread(project.repo.units)
                drop = beyond_policy(units, config.checkpoint_keep_turns, config.checkpoint_keep_days, utcnow())
                if not drop:
                    return 0
                marks = await self.lists.keep_rows(project.repo, [u for u in units if u.id in drop])
                pruned = await project.repo.prune(drop, marks, {
                    "at": now_iso(), "keepTurns": config.checkpoint_keep_turns,
                    "keepDays": config.checkpoint_keep_days})
            except Exception as exc:  # retention never fails anything: the next look tries again
                log.warning("pruning the checkpoints of %s failed: %s", root, exc)
                return 0
        log.info("pruned the checkpoints of %d turns and reverts of %s (%s)", len(drop), root, self.policy())
        return pruned and len(drop)

    def _root_busy(self, root: str) -> bool:
        """Whether a turn runs in ``root`` (each session's root asked of the store once: with 64 turns
        running, reading every one of theirs at each look was 4,096 reads as their 64 projects pruned)."""
        return any(self._root(live.session_id) == Path(root) for live in list(self.p.live.turns.values()))

    async def changes(self, session_id: Any, turn_id: Any = None, path: Any = None, limit: Any = None,
                      cursor: Any = None, diff: Any = None) -> dict[str, Any]:
        """``session.changes``: the stored lists (``host/changes.py``); never under the project's lock."""
        session = self.p.session(validate.ident(session_id, "sessionId"))
        if turn_id is not None:
            turn_id = validate.ident(turn_id, "turnId")
        project = self._project(Path(session.root))
        return await self.lists.read(session, turn_id, path, limit, cursor, diff,
                                     lambda: project.off or project.note)

    # ---- session.revert ------------------------------------------------------------------

    async def revert(self, session_id: Any, turn_id: Any) -> dict[str, Any]:
        session = self.p.session(validate.ident(session_id, "sessionId"))
        turn_id = validate.ident(turn_id, "turnId")
        self._refuse_busy(session.id, session.root)
        project = self._project(Path(session.root))
        if project.off is not None:
            raise Conflict(f"cannot revert: {project.off}", Code.NOT_FOUND)
        async with project.lock:
            self._refuse_busy(session.id, session.root)
            found = await asyncio.to_thread(self._target, project, session.id, turn_id)
            if found is None:
                self._not_found(project, session.id, turn_id)
            start, target, held_then = found
            revert_id = new_id("rv")
            at = now_iso()
            try:
                current = await project.repo.snapshot(full=True)
                held_now = sorted(project.repo.held)
                note = {"root": session.root, "session": session.id, "turn": turn_id, "revertId": revert_id,
                        "from": current, "to": target, "at": at}
                files = await project.repo.restore(current, target, note, keep=set(held_then))
                kept = self._not_restored(project, await asyncio.to_thread(project.repo.big_since, start),
                                          held_then, files)
                after = await project.repo.snapshot(full=True)
                await asyncio.to_thread(project.repo.append, {
                    "k": "revert", "s": session.id, "id": revert_id, "t": turn_id, "prev": current, "tree": after,
                    "at": at} | ({"prevHeld": held_now} if held_now else {}), durable=True)
            except (CheckpointError, OSError) as exc:
                raise PideskError(f"the revert could not finish: {exc}; files already restored stay restored "
                                  "— run it again once the cause is fixed") from None
            project.last = after
        with self.p.store.db.tx() as db:
            repo.audit(db, "workspace.reverted", session.id, None, turn=turn_id, revert_id=revert_id, files=files)
        self.p.store.faults.hit("revert.before_row")
        await self.lists.reverted(session.id, revert_id, at=at, revert_of=turn_id, before=current, after=after,
                                  shadow=project.repo)
        return {"files": files, "revertId": revert_id, "notRestored": kept}

    @staticmethod
    def _target(project: _Project, session_id: str, turn_id: str) -> tuple[int, str, list[str]] | None:
        """Where a revert of ``turn_id`` (a turn, or a revert by its id) goes: its line's place in the
        journal, the tree and the files over the size cap then."""
        found = project.repo.find(session_id, turn_id, "turn")
        if found is not None:
            return found[0], found[1]["tree"], found[1].get("held", [])
        found = project.repo.find(session_id, turn_id, "revert")
        if found is not None:
            return found[0], found[1]["prev"], found[1].get("prevHeld", [])
        return None

    def _not_found(self, project: _Project, session_id: str, turn_id: str) -> NoReturn:
        """NOT_FOUND for a revert with no checkpoint to go to — saying so when the retention policy pruned it."""
        horizon = project.repo.pruned_before(session_id)
        if horizon is not None:
            with self.p.store.db.read() as db:
                item = repo.change_item(db, session_id, turn_id)
            if item is not None and item.at <= horizon:
                raise NotFound(f"the checkpoint before {turn_id!r} was pruned by the retention policy "
                               f"({self.policy()}): it can no longer be reverted")
        raise NotFound(f"no checkpoint before {turn_id!r} in session {session_id} "
                       "(a turn from before checkpoints, or of another session)")

    @staticmethod
    def _not_restored(project: _Project, since_target: list[dict[str, Any]], held_then: list[str], files: list[str]
                      ) -> list[str]:
        """The files a revert left as they are because no checkpoint holds the content they had, or
        have: those over the size cap when its target was taken or now, and those over it that
        calls since then came upon."""
        since = {path for e in since_target for path, _status, _size in e.get("big", ())}
        root = project.repo.root
        return sorted(p for p in (since | project.repo.held | set(held_then)) - set(files) if (root / p).exists())

    def _refuse_busy(self, session_id: str, root: str) -> None:
        if self.p.is_busy(session_id):
            raise Conflict("the session is busy; revert once it is idle (stop or finish the turn)", Code.AGENT_BUSY)
        for live in list(self.p.live.turns.values()):
            try:
                other = self.p.session(live.session_id)
            except PideskError:
                continue
            if other.root == root:
                raise Conflict(f"session {other.id} is running in the same project; revert once it is idle",
                               Code.AGENT_BUSY)


def beyond_policy(units: list[JournalUnit], keep_turns: int, keep_days: float, now: datetime) -> set[str]:
    """The ids of the turns and reverts (``units``, in the journal's order) the retention policy no
    longer keeps: beyond each session's last ``keep_turns`` (its reverts count as turns), or made more
    than ``keep_days`` ago. 0 lifts either limit."""
    drop: set[str] = set()
    if keep_days > 0:
        cutoff = iso(now - timedelta(days=keep_days))
        drop |= {u.id for u in units if u.at and u.at < cutoff}
    if keep_turns > 0:
        by_session: dict[str, list[str]] = {}
        for u in units:
            by_session.setdefault(u.session, []).append(u.id)
        for ids in by_session.values():
            drop.update(ids[:max(0, len(ids) - keep_turns)])
    return drop


# ---- permission previews ----------------------------------------------------------------


def preview(tool: str, args: dict[str, Any], root: Path) -> dict[str, Any] | None:
    """``PermissionRequest.preview`` for Write and Edit: the diff the call would make, and
    whether a Write replaces an existing file. Computed from the proposed arguments and the
    file as it is then; None for other tools or arguments that do not fit. Blocking and pure
    Python (difflib): call it off the event loop, once (the request keeps it). Bounded: a file
    over ``PREVIEW_LIMIT`` bytes is not read, and a diff of more than ``PREVIEW_LINES`` lines a
    side is not computed (difflib's matching grows with their product: 10,000 lines took 13-18 s)
    — the preview then says how many lines change instead."""
    if tool not in ("Write", "Edit"):
        return None
    path = args.get("path")
    if not isinstance(path, str) or not path:
        return None
    target = root / path
    try:
        exists = target.is_file()
        if exists and target.stat().st_size > PREVIEW_LIMIT:
            return {"diff": f"({path} is larger than {PREVIEW_LIMIT // 1024} KiB: no preview)", "overwrites": True}
        old = target.read_text(errors="replace") if exists else ""
    except (OSError, ValueError):
        return None
    if tool == "Write":
        new = args.get("content")
        if not isinstance(new, str):
            return None
    else:
        old_text, new_text = args.get("oldText"), args.get("newText")
        if not isinstance(old_text, str) or not isinstance(new_text, str) or not old_text or old_text not in old:
            return {"diff": "", "overwrites": False}
        new = old.replace(old_text, new_text) if args.get("replaceAll") else old.replace(old_text, new_text, 1)
    overwrites = tool == "Write" and exists
    before, after = old.splitlines(keepends=True), new.splitlines(keepends=True)
    if max(len(before), len(after)) > PREVIEW_LINES:
        removed, added = Counter(before) - Counter(after), Counter(after) - Counter(before)
        return {"diff": f"(diff too large to show: {path} goes from {len(before):,} to {len(after):,} lines; "
                        f"about {sum(removed.values()):,} removed and {sum(added.values()):,} added)",
                "overwrites": overwrites}
    lines = difflib.unified_diff(before, after, fromfile="/dev/null" if not exists else f"a/{path}", tofile=f"b/{path}")
    text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
    return {"diff": text, "overwrites": overwrites}
