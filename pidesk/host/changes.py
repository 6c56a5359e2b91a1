"""What each turn changed, kept once (issue 33 §1): the lists ``session.changes`` reads.

``session.changes`` used to work every turn's changes out again on each call — the whole
checkpoint journal read per turn and a few git processes per turn, under the project's lock
(21-26 s at 1,000 turns; a page asked it after each turn, so each turn took 20 s). Now:

- **When a turn ends** (``settle``, from ``Checkpoints.turn_ended``) its list is worked out in the
  background once the checkpoints the turn started are recorded: the diff from the turn's
  "before" tree to its last call's tree, restricted to the files its own calls changed (when
  another session's checkpoint came between its calls; otherwise nothing to restrict), each file's
  status, line counts and the binary / too-large flags — one ``git diff-tree --raw --numstat``,
  no diffs. It is written as one row (``turn_changes``, ``store/repo/changes.py``) with the first
  line of the turn's prompt. The row is not synced: lost to a crash, it is worked out again.
- **A revert** writes its row after its journal line (``reverted``).
- **A read** (``read``) takes rows: a page of the session's turns and reverts (``limit``,
  ``cursor``), all of them, one, or one file of one. Diffs are made only for what is asked with
  them (``diff``; by default all but a page) — one ``git diff-tree --stdin`` for every turn of
  the answer — and never under the project's lock: they read objects, which the writer only adds.
- **A row missing** is worked out from the journal when first read, then stored: turns from
  before the table, one whose host died between its checkpoints and its row, and a revert whose
  row was lost the same way (the journal's reverts are looked for on a root's first read in a
  process). A turn still running is worked out from its checkpoints so far, not stored. A read
  asked while a turn's list is being settled waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pidesk.core.errors import InvalidParams, NotFound, PideskError
from pidesk.core.records import Session
from pidesk.host import paging, validate
from pidesk.host.live import LiveTurn
from pidesk.host.parts import Parts
from pidesk.store import repo
from pidesk.store.checkpoints import CheckpointError, JournalUnit, ShadowRepo
from pidesk.store.repo.changes import ChangeItem

if TYPE_CHECKING:
    from pidesk.host.checkpoints import _Project

log = logging.getLogger("pidesk.checkpoints")

PROMPT_CHARS = 120  # of a prompt's first line, kept to name the turn


@dataclass(frozen=True)
class Listed:
    """A turn's or revert's files (without git's diffs) and the trees they are between."""

    before: str | None
    after: str | None
    files: list[dict[str, Any]]


# ---- working a list out -------------------------------------------------------------------


async def turn_files(shadow: ShadowRepo, entries: list[dict[str, Any]]) -> Listed:
    """A turn's files from its journal entries (its "turn" checkpoint, then its calls', in order): for
    the files its own calls changed, the change from its "before" tree to its last tree. A file
    counts for the turn whose call's checkpoint first saw it change (two sessions share a root)."""
    start = next((e for e in entries if e.get("k") == "turn"), None)
    calls = [e for e in entries if e.get("k") == "call"]
    if start is None or not calls:
        return Listed(None, None, [])
    before, after = start["tree"], calls[-1]["tree"]
    chained = before
    touched: set[str] | None = None  # None: every change from before to after is the turn's own
    for call in calls:
        if (call.get("prev") or before) != chained:  # a checkpoint of someone else's came between
            touched = set()
            break
        chained = call["tree"]
    if touched is not None:
        for call in calls:
            touched |= await shadow.changed_paths(call.get("prev") or before, call["tree"])
    files: dict[str, dict[str, Any]] = {}
    for stat in await shadow.stat(before, after, only=touched):
        files[stat.path] = {"path": stat.path, "status": stat.status, "additions": stat.additions,
                            "deletions": stat.deletions} | ({"binary": True} if stat.binary else {})
    for path in set(start.get("held", ())) & set(files):  # its "before" in the tree is older than the turn
        files[path] = {"path": path, "status": files[path]["status"], "additions": 0, "deletions": 0,
                       "diff": f"({path} was over the checkpoint limit before this turn, so there is no diff: "
                               "its content now is recorded)"}
    big: dict[str, tuple[str, int]] = {}
    for call in calls:
        big |= {path: (status, size) for path, status, size in call.get("big", ())}
    for path, (status, size) in big.items():
        files[path] = too_large(path, files[path]["status"] if path in files else status, size, shadow.size_cap)
    return Listed(before, after, list(files.values()))


async def revert_files(shadow: ShadowRepo, before: str | None, after: str | None) -> list[dict[str, Any]]:
    """A revert's files: every change from the state it replaced to the state it made."""
    if before is None or after is None:
        return []
    return [{"path": s.path, "status": s.status, "additions": s.additions, "deletions": s.deletions}
            | ({"binary": True} if s.binary else {}) for s in await shadow.stat(before, after)]


def too_large(path: str, status: str, size: int, cap: int) -> dict[str, Any]:
    """A file no checkpoint could record (over the size cap)."""
    return {"path": path, "status": status, "additions": 0, "deletions": 0, "tooLarge": True,
            "diff": f"({path} is {_mib(size)}, over the {_mib(cap)} checkpoint limit: its content was not "
                    "recorded, and a revert leaves it as it is)"}


def prompt_line(text: str | None) -> str | None:
    """What names a turn: its prompt's first non-blank line, cut at ``PROMPT_CHARS``."""
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= PROMPT_CHARS else line[:PROMPT_CHARS - 1].rstrip() + "…"
    return None


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):,.1f} MiB" if size >= 1024 * 1024 else f"{size:,} bytes"


# ---- the lists -----------------------------------------------------------------------------


class ChangeLists:
    """The stored lists of one host: settled at each turn's end, read by ``session.changes``."""

    def __init__(self, parts: Parts, project: Callable[[Path], _Project],
                 track: Callable[[asyncio.Task[None]], None]) -> None:
        self.p = parts
        self._project = project
        self._track = track
        self._journaled: dict[str, list[dict[str, Any]]] = {}  # turn id -> its checkpoints' entries, while it runs
        self._settling: dict[str, tuple[str, asyncio.Task[None]]] = {}  # turn id -> (session id, its settling)
        self._reconciled: set[Path] = set()  # roots whose journal's reverts have rows (this process)
        # session id -> held while its missing rows are worked out (kept while someone holds or awaits it)
        self._filling: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def journaled(self, turn_id: str, entry: dict[str, Any]) -> None:
        """A checkpoint of a running turn was journaled (its list is worked out from these)."""
        self._journaled.setdefault(turn_id, []).append(entry)

    # ---- writing -------------------------------------------------------------------------

    def settle(self, live: LiveTurn, root: Path, recording: Collection[asyncio.Task[None]]) -> None:
        """The turn has ended: store its list once ``recording`` (its checkpoints) are done."""
        prompt = prompt_line(live.draft.text) if live.draft is not None else None
        task = asyncio.create_task(self._settle(live.session_id, live.turn_id, root, list(recording), prompt),
                                   name=f"changes {live.turn_id}")
        turn_id = live.turn_id
        self._settling[turn_id] = (live.session_id, task)
        task.add_done_callback(lambda _: self._settling.pop(turn_id, None))
        self._track(task)

    async def _settle(self, session_id: str, turn_id: str, root: Path, recording: list[asyncio.Task[None]],
                      prompt: str | None) -> None:
        try:
            if recording:
                await asyncio.gather(*recording, return_exceptions=True)
            entries = self._journaled.pop(turn_id, [])
            listed = await turn_files(self._project(root).repo, entries)
            if prompt is None:
                prompt = prompt_line((await self.p.in_thread(self.p.store.turn_prompts, session_id, [turn_id]))
                                     .get(turn_id))
            self.p.store.faults.hit("changes.before_row")
            with self.p.store.db.tx(durable=False) as db:  # (lost to a crash, it is worked out again)
                repo.put_turn_changes(db, turn_id, session_id, prompt=prompt, before=listed.before,
                                      after=listed.after, files=listed.files, replace=True)
        except Exception:  # its list is worked out when it is read instead
            log.warning("the changes of turn %s were not stored", turn_id, exc_info=True)

    async def reverted(self, session_id: str, revert_id: str, *, at: str, revert_of: str, before: str,
                       after: str, shadow: ShadowRepo) -> None:
        """A revert was journaled: its row (its files worked out now, or when first read)."""
        try:
            files: list[dict[str, Any]] | None = await revert_files(shadow, before, after)
        except CheckpointError:
            files = None
        with self.p.store.db.tx(durable=False) as db:
            repo.put_revert_changes(db, revert_id, session_id, at=at, revert_of=revert_of, before=before,
                                    after=after, files=files)

    async def keep_rows(self, shadow: ShadowRepo, units: list[JournalUnit]) -> dict[str, str]:
        """Before a prune forgets ``units``: each has its row with its files (rows outlive checkpoints).
        Returns, by session, the newest time (a turn's start, a revert's) among them."""
        with self.p.store.db.read() as db:
            stored = {item.id: item for u in units if (item := repo.change_item(db, u.session, u.id)) is not None}
        marks: dict[str, str] = {}
        for u in units:
            if u.id in stored:
                marks[u.session] = max(marks.get(u.session, ""), stored[u.id].at)
        by_session: dict[str, set[str]] = {}
        for u in units:
            item = stored.get(u.id)
            if u.kind == "turn" and (item is None or item.files is None):
                by_session.setdefault(u.session, set()).add(u.id)
            elif u.kind == "revert" and item is not None and item.files is None:
                files = await revert_files(shadow, item.before, item.after)
                with self.p.store.db.tx(durable=False) as db:
                    repo.fill_changes(db, item.id, files)
        for session_id, ids in by_session.items():
            journal = await asyncio.to_thread(shadow.turn_entries, session_id, ids)
            prompts = await self.p.in_thread(self.p.store.turn_prompts, session_id, sorted(ids))
            for turn_id in sorted(ids):
                listed = await turn_files(shadow, journal.get(turn_id, []))
                with self.p.store.db.tx(durable=False) as db:
                    repo.put_turn_changes(db, turn_id, session_id, prompt=prompt_line(prompts.get(turn_id)),
                                          before=listed.before, after=listed.after, files=listed.files,
                                          replace=False)
        return marks

    # ---- reading -------------------------------------------------------------------------

    async def read(self, session: Session, turn_id: str | None, path: Any, limit: Any, cursor: Any, diff: Any,
                   note: Callable[[], str | None]) -> dict[str, Any]:
        """``session.changes``: see docs/protocol-notes.md."""
        paged = limit is not None or cursor is not None
        if diff is not None and not isinstance(diff, bool):
            raise InvalidParams(f"diff must be true or false; got {validate.brief(diff)}")
        with_diffs = not paged if diff is None else diff
        if path is not None:
            path = validate.text(path, "path")
            if turn_id is None:
                raise InvalidParams("path names a file of one turn: give turnId too")
        if paged and turn_id is not None:
            raise InvalidParams("limit and cursor page a session's turns: not with turnId")
        count = paging.page_size(limit) if paged else None
        after = paging.parse_cursor(cursor, "session.changes") if cursor is not None else None
        project = self._project(Path(session.root))
        await self._wait_settled(session.id, turn_id)
        await self._reconcile(project)
        next_cursor = None
        if turn_id is not None:
            with self.p.store.db.read() as db:
                item = repo.change_item(db, session.id, turn_id)
            if item is None:
                raise NotFound(f"no turn {turn_id!r} in session {session.id}")
            items = [item]
        elif count is not None:
            with self.p.store.db.read() as db:
                items, next_cursor = paging.page(repo.change_items(db, session.id, after, count + 1), count, _key)
        else:  # every item, oldest first (as every page is)
            def read(after: paging.Key | None, count: int) -> list[ChangeItem]:
                with self.p.store.db.read() as db:
                    return repo.change_items(db, session.id, after, count)

            items = await paging.every(read, _key)
        try:
            items = await self._complete(project, session.id, items)
            turns = [self._wire(item) for item in items]
            if path is not None:
                turns[0]["files"] = [f for f in turns[0]["files"] if f["path"] == path]
                if not turns[0]["files"]:
                    raise NotFound(f"turn {turn_id} changed no file {path!r}")
            if with_diffs:
                await self._add_diffs(project.repo, items, turns, self._pruned(project.repo, session.id))
        except CheckpointError as exc:
            raise PideskError(f"cannot read the checkpoints of {session.root}: {exc}") from None
        return {"turns": turns, "note": note(), "nextCursor": next_cursor}

    async def _wait_settled(self, session_id: str, turn_id: str | None) -> None:
        """A turn that has just ended: its list is being stored — wait for it."""
        tasks = [task for tid, (sid, task) in list(self._settling.items())
                 if sid == session_id and (turn_id is None or tid == turn_id)]
        if tasks:
            await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))

    async def _reconcile(self, project: _Project) -> None:
        """On a root's first read in this process: a row for each revert its journal holds (one whose
        row a crash lost, or from before the table); their files are worked out when read."""
        root = project.repo.root
        if root in self._reconciled:
            return
        self._reconciled.add(root)
        reverts = await asyncio.to_thread(project.repo.reverts)
        if not reverts:
            return
        with self.p.store.db.read() as db:
            known = repo.stored_change_ids(db, (e.get("id", "") for e in reverts))
        missing = [e for e in reverts if e.get("id") and e["id"] not in known]
        if missing:
            with self.p.store.db.tx(durable=False) as db:
                for e in missing:
                    repo.put_revert_changes(db, e["id"], e.get("s", ""), at=e.get("at", ""), revert_of=e.get("t"),
                                            before=e.get("prev"), after=e.get("tree"), files=None)

    async def _complete(self, project: _Project, session_id: str, items: list[ChangeItem]) -> list[ChangeItem]:
        """``items`` with every list worked out: a revert's not filled yet, a running turn's so far (not
        stored), and a turn's without a row, from the journal (then stored)."""
        if all(item.files is not None for item in items):
            return items
        lock = self._filling.get(session_id)
        if lock is None:
            lock = self._filling[session_id] = asyncio.Lock()
        async with lock:  # (two readers at once — a page and a CLI — work a session's rows out once)
            return await self._fill(project, session_id, items)

    async def _fill(self, project: _Project, session_id: str, items: list[ChangeItem]) -> list[ChangeItem]:
        unknown = [item.id for item in items if item.files is None]
        with self.p.store.db.read() as db:  # filled meanwhile by another reader?
            fresh = {item_id: repo.change_item(db, session_id, item_id) for item_id in unknown}
        items = [fresh.get(item.id) or item for item in items]
        live = self.p.live.turns.get(session_id)
        running = live.turn_id if live is not None else None
        missing = [i for i in items if i.files is None and not i.revert and i.id != running]
        journal: dict[str, list[dict[str, Any]]] = {}
        prompts: dict[str, str] = {}
        if missing:
            journal = await asyncio.to_thread(project.repo.turn_entries, session_id, {i.id for i in missing})
            prompts = await self.p.in_thread(self.p.store.turn_prompts, session_id, [i.id for i in missing])
        done: list[ChangeItem] = []
        for item in items:
            if item.files is not None:
                done.append(item)
            elif item.revert:
                files = await revert_files(project.repo, item.before, item.after)
                with self.p.store.db.tx(durable=False) as db:
                    repo.fill_changes(db, item.id, files)
                done.append(_with(item, item.before, item.after, files))
            elif item.id == running:
                listed = await turn_files(project.repo, list(self._journaled.get(item.id, ())))
                done.append(_with(item, listed.before, listed.after, listed.files, prompt_line(
                    live.draft.text) if live is not None and live.draft is not None else None))
            else:
                listed = await turn_files(project.repo, journal.get(item.id, []))
                prompt = prompt_line(prompts.get(item.id))
                with self.p.store.db.tx(durable=False) as db:
                    repo.put_turn_changes(db, item.id, session_id, prompt=prompt, before=listed.before,
                                          after=listed.after, files=listed.files, replace=False)
                done.append(_with(item, listed.before, listed.after, listed.files, prompt))
        return done

    @staticmethod
    def _wire(item: ChangeItem) -> dict[str, Any]:
        """An item as ``session.changes`` gives it, its files without git's diffs."""
        out: dict[str, Any] = {"turnId": item.id, "at": item.at, "prompt": item.prompt,
                               "files": [{k: v for k, v in f.items() if k != "diff"} for f in item.files or ()]}
        if item.revert:
            out |= {"revert": True, "revertOf": item.revert_of or None}
        return out

    def _pruned(self, shadow: ShadowRepo, session_id: str) -> Callable[[ChangeItem], str | None]:
        """What a pruned turn's or revert's diffs say instead (None for one still kept)."""
        horizon = shadow.pruned_before(session_id)
        config = self.p.config

        def said(item: ChangeItem) -> str | None:
            if horizon is None or item.at > horizon:
                return None
            return ("(the checkpoints of this turn were pruned by the retention policy — checkpoint_keep_turns = "
                    f"{config.checkpoint_keep_turns}, checkpoint_keep_days = {config.checkpoint_keep_days:g} — "
                    "so its diff is gone; the list of files stays)")

        return said

    @staticmethod
    async def _add_diffs(shadow: ShadowRepo, items: list[ChangeItem], turns: list[dict[str, Any]],
                         pruned: Callable[[ChangeItem], str | None]) -> None:
        """Each file's ``diff``: the sentence its row holds, ``"binary"``, git's (one process for all), or
        the sentence saying the retention policy pruned it."""
        wanted: set[str] = set()
        pairs: list[tuple[str, str]] = []
        for item, turn in zip(items, turns, strict=True):
            gone = pruned(item)
            if gone is not None:
                for f in turn["files"]:
                    f["diff"] = gone
                continue
            stored = {f["path"]: f for f in item.files or ()}
            needs = [f["path"] for f in turn["files"] if "diff" not in stored[f["path"]] and not f.get("binary")]
            if needs and item.before is not None and item.after is not None:
                pairs.append((item.before, item.after))
                wanted.update(needs)
        patches = await shadow.patches(pairs, wanted) if pairs else {}
        for item, turn in zip(items, turns, strict=True):
            if pruned(item) is not None:
                continue
            stored = {f["path"]: f for f in item.files or ()}
            found = patches.get((item.before or "", item.after or ""), {})
            for f in turn["files"]:
                kept = stored[f["path"]].get("diff")
                f["diff"] = kept if kept is not None else "binary" if f.get("binary") else found.get(f["path"], "")


def _with(item: ChangeItem, before: str | None, after: str | None, files: list[dict[str, Any]],
          prompt: str | None = None) -> ChangeItem:
    return ChangeItem(id=item.id, at=item.at, revert=item.revert, revert_of=item.revert_of,
                      prompt=item.prompt or prompt, before=before, after=after, files=files, stored=True)


def _key(item: ChangeItem) -> paging.Key:
    return item.at, item.id
