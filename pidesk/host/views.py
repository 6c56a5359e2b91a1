"""The model's view of each session, kept between its requests (issue 33 §2): a request costs what is new.

A request used to read and decode the session's whole transcript, then find its last cut:
20 ms of host CPU a turn at 100 turns, 1.8 s at 50,000. Now each session's view is a
``ViewState`` (runtime/context_window.py) kept here with the transcript offset it has read
up to, so a request reads and decodes only the lines appended since the last one, and the
guard's sizes are running sums. What a request sees is unchanged: ``ViewState.render`` is
``model_view`` of the transcript, to the byte (tests/host/test_views.py).

**Built from the last cut, never from the start** (a restart, an evicted view): the transcript
is searched backwards for its last cut by bytes — a compaction's ``"compaction"`` tag, a
NewContext result's ``"NewContext"`` — without decoding a line that holds neither; each line
found is decoded to check it. The view is then decoded forwards from the cut (from the first
message a compaction kept), in slices of ``SLICE_BYTES``, each one uninterruptible call of
~3 ms, and pruned as it goes (a view past its window holds only its window). A transcript
with no cut is decoded from its first message, once. A view is built in a worker thread;
``read(quick=True)`` — what a turn's request tries first, on the event loop — only catches
up a warm view with at most ``QUICK_BYTES`` of new lines, and answers None otherwise.

**Never stale.** Each view carries the transcript's ``generation`` it was read at: every cut,
replacement or removal of a transcript (a smart stop, a delete, a failed append undone)
counts a new one, and a view of an older one is built again. A compaction is an append: it
restarts the view as it is read. A fork is a new session with a view of its own. Nothing
else changes a transcript.

**Bounded.** At most ``MAX_VIEWS`` views and ``MAX_TOKENS`` estimated tokens of messages are
kept; past either the least recently used go (an evicted view is built again when next asked).
A view holds at most about twice its window (``ViewState``'s pruning).

The count of compactions ``session.context`` reports is kept with the view: counted once by
a byte search of the whole transcript when first asked, then as compactions are read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from pidesk.core.errors import NotFound
from pidesk.core.records import Message
from pidesk.runtime.context_window import ViewState, compaction_of, cut_in
from pidesk.store.transcripts import Transcripts, decode_message, decode_messages

QUICK_BYTES = 64 * 1024  # new lines a request decodes on the event loop; past it, in a worker thread
MAX_VIEWS = 256
MAX_TOKENS = 8_000_000  # estimated tokens of messages kept across all views (~32 MB of text, ~2x that in objects)
_CUT_MARKERS = (b'"compaction"', b'"NewContext"')  # as a JSON string: only where a value or key is exactly that
_COMPACTION_MARKERS = (b'"compaction"',)

Note = Callable[[ViewState], str]  # the host's record of the session, for the opening after a cut


@dataclass
class _View:
    state: ViewState | None = None
    generation: int = -1  # of the transcript, when ``state`` was read from it
    end: int = 0  # the transcript's bytes ``state`` has read
    compactions: int | None = None  # compaction messages in those bytes (None: not counted yet)
    tokens: int = 0  # what ``state`` holds, as last accounted (the LRU's budget)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Views:
    """Every session's kept view. Thread-safe: a view is read under its own lock, and built under it."""

    def __init__(self, transcripts: Transcripts, limit_tokens: int, max_views: int = MAX_VIEWS,
                 max_tokens: int = MAX_TOKENS) -> None:
        self.transcripts = transcripts
        self.limit = limit_tokens
        self.max_views = max_views
        self.max_tokens = max_tokens
        self.builds = 0  # views built from a transcript (a cold start, an eviction, a cut): for tests and benches
        self._views: OrderedDict[str, _View] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()

    # ---- reading ---------------------------------------------------------------------------------

    def read(self, session_id: str, note: Note, quick: bool = False) -> list[Message] | None:
        """The session's view now (``ViewState.render``). ``quick``: only if that costs no wait and no
        build — a warm view, free, with at most ``QUICK_BYTES`` to catch up on — else None."""
        view = self._view(session_id)
        if not view.lock.acquire(blocking=not quick):
            return None
        try:
            with self._found(session_id):
                state = self._current(session_id, view, quick)
            if state is None:
                return None
            messages = state.render(lambda: note(state))
            tokens = state.tokens
        finally:
            view.lock.release()
        self._account(session_id, view, tokens)
        return messages

    def after(self, session_id: str, message: Message, note: Note) -> list[Message]:
        """The view as it would be with ``message`` appended (a compaction about to be recorded)."""
        view = self._view(session_id)
        with view.lock, self._found(session_id):
            current = self._current(session_id, view, False)
            assert current is not None
            state = current.copy()
            if not state.add(message):  # it keeps messages the view has let go of: the whole transcript, once
                state = ViewState.of([*self.transcripts.messages(session_id), message], self.limit)
            return state.render(lambda: note(state))

    def compactions(self, session_id: str) -> int:
        """How many compactions the session's transcript holds (``session.context``'s ``window``)."""
        view = self._view(session_id)
        with view.lock, self._found(session_id):
            self._current(session_id, view, False)
            if view.compactions is None:
                transcripts = self.transcripts
                view.compactions = sum(1 for _at, line in transcripts.lines_marked(
                    session_id, _COMPACTION_MARKERS, transcripts.body_start(session_id), view.end)
                    if compaction_of(decode_message(line)) is not None)
            return view.compactions

    # ---- keeping a view current --------------------------------------------------------------------

    def _current(self, session_id: str, view: _View, quick: bool) -> ViewState | None:
        """The view's state caught up with the transcript (the caller holds its lock); None: not quickly."""
        if view.state is not None:
            caught = self._catch_up(session_id, view, quick)
            if caught is not False:
                return view.state if caught else None
        if quick:
            return None
        return self._build(session_id, view)[0]

    def _catch_up(self, session_id: str, view: _View, quick: bool) -> bool | None:
        """Read the lines appended since; False: the view must be built again, None: not quickly."""
        state = view.state
        assert state is not None
        transcripts = self.transcripts
        generation = transcripts.generation(session_id)
        if generation != view.generation:
            return False
        read = transcripts.read_from(session_id, view.end, QUICK_BYTES if quick else None)
        if read is None:
            return False
        lines, more = read
        if more:
            return None
        if not lines:
            return True
        messages = decode_messages(lines)
        if transcripts.generation(session_id) != generation:
            return False
        if quick and any(cut_in(m) is not None for m in messages):
            return None  # (a cut may need the transcript read again: not on the loop)
        for message in messages:
            if message.seq <= state.last_seq or not state.add(message):
                view.state = None
                return False
            if view.compactions is not None and compaction_of(message) is not None:
                view.compactions += 1
        view.end += len(lines)
        return True

    def _build(self, session_id: str, view: _View) -> tuple[ViewState, int]:
        """Build the view from the transcript's last cut (the caller holds its lock)."""
        transcripts = self.transcripts
        for _attempt in range(3):
            generation = transcripts.generation(session_id)
            state, end, compactions = self._from_last_cut(session_id)
            if transcripts.generation(session_id) == generation:
                break
        self.builds += 1
        view.state, view.generation, view.end, view.compactions = state, generation, end, compactions
        return state, end

    def _from_last_cut(self, session_id: str) -> tuple[ViewState, int, int | None]:
        """(the state, the bytes it read, the compactions counted if the search read them all)."""
        transcripts = self.transcripts
        start, end = transcripts.body_start(session_id), transcripts.complete_end(session_id)
        cut: Message | None = None
        cut_at = cut_end = start  # where its line begins and ends
        compaction: Message | None = None
        for offset, line in transcripts.lines_marked(session_id, _CUT_MARKERS, start, end):
            message = decode_message(line)
            if cut_in(message) is None:
                continue
            if cut is None:
                cut, cut_at, cut_end = message, offset, offset + len(line)
            if compaction_of(message) is not None:
                compaction = message
                break  # (past a NewContext cut, on to the last compaction: ``ViewState.in_view``)
        if cut is None:
            state = ViewState(self.limit)
            resume = start
        else:
            state = ViewState.resumed(self.limit, cut, compaction, self._kept(session_id, cut, start, cut_at))
            resume = cut_end
        for lines in transcripts.slices(session_id, resume, end):
            for message in decode_messages(lines):
                state.add(message)
            state.prune()
        return state, end, 0 if compaction is None else None

    def _kept(self, session_id: str, cut: Message, start: int, cut_at: int) -> list[Message]:
        """The messages a compaction ``cut`` (whose line begins at ``cut_at``) keeps: those before it from its
        ``kept_from_seq`` on, read backwards until one is older."""
        block = compaction_of(cut)
        if block is None or block.kept_from_seq is None:
            return []
        kept: list[Message] = []
        for _low, lines in self.transcripts.chunks_back(session_id, start, cut_at):
            end = len(lines)
            while end:  # one line at a time, newest first: only the kept ones (and one more) are decoded
                begin = lines.rfind(b"\n", 0, end - 1) + 1
                message = decode_message(lines[begin:end])
                if message.seq < block.kept_from_seq:
                    kept.reverse()
                    return kept
                kept.append(message)
                end = begin
        kept.reverse()
        return kept

    # ---- the cache -------------------------------------------------------------------------------------

    def _view(self, session_id: str) -> _View:
        with self._lock:
            view = self._views.get(session_id)
            if view is None:
                view = self._views[session_id] = _View()
            else:
                self._views.move_to_end(session_id)
            return view

    def _account(self, session_id: str, view: _View, tokens: int) -> None:
        """Count what the view holds now, and let the least recently used views go past the bounds."""
        with self._lock:
            if self._views.get(session_id) is not view:
                return  # (evicted meanwhile)
            self._tokens += tokens - view.tokens
            view.tokens = tokens
            while len(self._views) > 1 and (len(self._views) > self.max_views or self._tokens > self.max_tokens):
                oldest, gone = next(iter(self._views.items()))
                if oldest == session_id:
                    break
                del self._views[oldest]
                self._tokens -= gone.tokens

    @contextmanager
    def _found(self, session_id: str) -> Iterator[None]:
        """A transcript gone (its session deleted meanwhile) is ``NOT_FOUND``; its view goes with it."""
        try:
            yield
        except FileNotFoundError:
            with self._lock:
                view = self._views.pop(session_id, None)
                if view is not None:
                    self._tokens -= view.tokens
            raise NotFound(f"no session {session_id!r}") from None
