"""What the model sees of a session: its transcript from the last cut on, never the transcript changed.

A *cut* is where the view starts again:

- **a compaction** (``CompactionBlock``, runtime/compaction.py): the view is an opening
  message — the host's state note, then the summary — followed by the messages the
  compaction kept (from ``kept_from_seq``, up to the compaction's own message) and every
  message after it;
- **NewContext** — the model asked for a fresh start with a summary: the opening message
  carries that summary, and everything after that call's result follows.

The state note is the host's (``note``, called only when there is a cut): the mode, the
permission mode and the contract as the host's records have them. The summary is the
model's own words and is labelled so.

A last guard keeps every request inside the window whatever happened before (a compaction
that failed, one huge message): past ``SAFETY`` of the limit the oldest messages of the view
leave it until it fits in ``LOW_WATER``, and a note says how many were left out. A kept
window starts at a user or assistant message, never at a tool result without its call.

Sizes are estimated at four characters a token: close enough to stay clear of the limit,
free of any tokenizer. The host corrects the estimate with the provider's own counts
(host/compaction.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any

import msgspec

from pidesk.core.records import CompactionBlock, Message, TextBlock, ToolResultBlock

CHARS_PER_TOKEN = 4
SAFETY = 0.95
LOW_WATER = 0.5
_encode = msgspec.json.Encoder().encode
SUMMARY_PREFIX = "Summary of the conversation so far (the earlier messages are out of view):\n"
SUMMARY_HEADING = ("[Summary of the conversation before this point, written by the model when it was compacted. "
                   "It is the model's own account: what the host's record above says wins over it.]\n")


def estimate_tokens(message: Message) -> int:
    size = 0
    for block in message.content:
        if isinstance(block, TextBlock):
            size += len(block.text)
        elif isinstance(block, ToolResultBlock):
            size += len(block.output) + 32
        elif isinstance(block, CompactionBlock):
            size += len(block.summary)
        else:  # a tool call, thinking or an attachment note: about its JSON's length
            size += len(_encode(block))
    return size // CHARS_PER_TOKEN + 4


def estimate_request(system: str, tools: list[dict[str, Any]], messages: list[Message]) -> int:
    """The estimated input tokens of a request: its system prompt, tool specs and messages (a view
    ``render`` built says its own, from the sizes it keeps)."""
    fixed = (len(system) + len(_encode(tools))) // CHARS_PER_TOKEN
    if isinstance(messages, Rendered):
        return fixed + messages.tokens
    return fixed + sum(estimate_tokens(m) for m in messages)


class Rendered(list[Message]):
    """A view as ``ViewState.render`` built it, with its estimated tokens (``estimate_request``): never
    changed in place (anything else is a new list)."""

    __slots__ = ("tokens",)

    def __init__(self, messages: list[Message], tokens: int) -> None:
        super().__init__(messages)
        self.tokens = tokens


def compaction_of(message: Message) -> CompactionBlock | None:
    for block in message.content:
        if isinstance(block, CompactionBlock):
            return block
    return None


def model_view(messages: list[Message], limit_tokens: int, note: Callable[[], str] = str) -> list[Message]:
    """The view of a whole transcript (``messages``, oldest first), built in one go."""
    return ViewState.of(messages, limit_tokens).render(note)


def cut_in(message: Message) -> CompactionBlock | ToolResultBlock | None:
    """What makes ``message`` a cut: its compaction block, else a successful NewContext result (None: no cut)."""
    compaction = compaction_of(message)
    if compaction is not None:
        return compaction
    for block in message.content:
        if isinstance(block, ToolResultBlock) and block.name == "NewContext" and block.ok:
            return block
    return None


class ViewState:
    """The view of one transcript, grown a message at a time: what a request sees is ``render``'s
    answer, the same as ``model_view`` of the whole transcript (tests/runtime/test_view_state.py).

    It holds the last cut's message, the view's messages (those a compaction kept, then every
    one after the cut) with their estimated sizes as running sums, so each request costs what
    was added since the last one plus a bisection for the guard — never a pass over the view.

    **Pruned.** Once the view's messages alone are past ``SAFETY`` of the window the guard
    holds for good (until the next cut: a view only grows), and its window only moves forward
    (each suffix of the view only grows), so the messages before it can never be sent again:
    they leave memory (``skipped`` counts them, for the guard's note). A later compaction that
    keeps messages from before what is held (``add`` answers False) needs the transcript again.

    Seqs in a transcript increase by one from 1 (the store's invariant): a compaction keeps the
    messages from ``kept_from_seq`` up to it, and the held messages tell whether they hold them.
    """

    __slots__ = ("limit", "session_id", "cut", "compaction", "messages", "cum", "total", "skipped", "kept",
                 "from_start", "last_seq")

    def __init__(self, limit_tokens: int) -> None:
        self.limit = limit_tokens
        self.session_id = ""
        self.cut: Message | None = None  # where the view starts again (a compaction's message, a NewContext result's)
        self.compaction: tuple[int, int | None] | None = None  # the transcript's last compaction: (seq, kept_from_seq)
        self.messages: list[Message] = []  # the view's messages after its opening, from the ``skipped``-th on
        self.cum = [0]  # cum[i]: the estimated tokens of messages[:i]
        self.total = 0  # the estimated tokens of every view message, the skipped ones too (the opening aside)
        self.skipped = 0
        self.kept = 0  # how many of the view's messages (skipped ones counted) come before ``cut``
        self.from_start = True  # ``messages`` begin at the transcript's first message
        self.last_seq = 0

    @classmethod
    def of(cls, messages: list[Message], limit_tokens: int) -> ViewState:
        """The state after a whole transcript (``messages``, oldest first)."""
        last_cut = next((i for i in range(len(messages) - 1, -1, -1) if cut_in(messages[i]) is not None), None)
        if last_cut is None:
            state = cls(limit_tokens)
            for message in messages:
                state.add(message)
            return state
        cut = messages[last_cut]
        compaction = next((m for m in reversed(messages[:last_cut + 1]) if compaction_of(m) is not None), None)
        kept = last_cut
        block = compaction_of(cut)
        if block is not None and block.kept_from_seq is not None:
            while kept > 0 and messages[kept - 1].seq >= block.kept_from_seq:
                kept -= 1
        state = cls.resumed(limit_tokens, cut, compaction, messages[kept:last_cut])
        for message in messages[last_cut + 1:]:
            state.add(message)
        return state

    @classmethod
    def resumed(cls, limit_tokens: int, cut: Message, compaction: Message | None, kept: list[Message]) -> ViewState:
        """The state at the transcript's last cut ``cut``, given its last compaction's message and what the
        cut keeps (for a compaction keeping messages: those from its ``kept_from_seq`` up to it)."""
        state = cls(limit_tokens)
        if compaction is not None:
            state.compaction = _compaction_ref(compaction)
        state._restart(cut, kept)
        return state

    # ---- growing --------------------------------------------------------------------------------

    def add(self, message: Message) -> bool:
        """Take the transcript's next message. False: it is a compaction keeping messages this state no
        longer holds (the state is unchanged; build it again from the transcript)."""
        cut = cut_in(message)
        if cut is None:
            size = estimate_tokens(message)
            self.messages.append(message)
            self.cum.append(self.cum[-1] + size)
            self.total += size
        elif isinstance(cut, CompactionBlock):
            kept = self._kept(cut.kept_from_seq)
            if kept is None:
                return False
            self.compaction = _compaction_ref(message)
            self._restart(message, kept)
        else:
            self._restart(message, [])
        self.session_id = message.session_id
        self.last_seq = message.seq
        return True

    def _restart(self, cut: Message, kept: list[Message]) -> None:
        self.cut = cut
        self.session_id = cut.session_id
        self.last_seq = cut.seq
        self.messages = list(kept)
        self.cum = [0]
        for message in kept:
            self.cum.append(self.cum[-1] + estimate_tokens(message))
        self.total = self.cum[-1]
        self.skipped = 0
        self.kept = len(kept)
        self.from_start = False

    def _kept(self, kept_from: int | None) -> list[Message] | None:
        """The messages before the next one with seq >= ``kept_from`` (walking back while they are), or
        None if some of them are no longer held."""
        if kept_from is None:
            return []
        held = self._held()
        start = len(held)
        while start > 0 and held[start - 1].seq >= kept_from:
            start -= 1
        if start == 0 and not self.from_start and (not held or held[0].seq > kept_from):
            return None  # the walk would go on into messages this state does not hold
        return held[start:]

    def _held(self) -> list[Message]:
        """The part of the transcript this state holds whole, up to its last message."""
        before = self.kept - self.skipped  # held messages before the cut
        if self.cut is None or before < 0:
            return self.messages
        return [*self.messages[:before], self.cut, *self.messages[before:]]

    # ---- a request's view -------------------------------------------------------------------------

    def render(self, note: Callable[[], str] = str) -> list[Message]:
        """What the model sees now: ``model_view`` of the transcript so far. ``note`` is called once if
        there is a cut (the host's record of the session, which opens the view after one)."""
        held = self.messages
        opening = self._opening(note()) if self.cut is not None else None
        has = 1 if opening is not None else 0
        opening_size = estimate_tokens(opening) if opening is not None else 0
        whole = opening_size + self.total
        if whole <= self.limit * SAFETY:
            return Rendered([opening, *held] if opening is not None else held, whole)
        budget = int(self.limit * LOW_WATER)
        count = len(held)
        fits = bisect_left(self.cum, self.cum[count] - budget)  # the first held message whose suffix fits
        start = has + self.skipped + fits
        if not fits and not self.skipped and opening is not None and self.cum[count] + opening_size <= budget:
            start = 0  # everything fits with the opening
        size = has + self.skipped + count
        while start < size - 1 and start >= has + self.skipped and held[start - has - self.skipped].role == "tool":
            start += 1  # never open the window on a tool result whose call is out of view
        if start == size:
            start = size - 1  # the newest message alone is bigger than the budget: keep it anyway
        if not start:
            self._prune(fits)
            return Rendered([opening, *held] if opening is not None else held, whole)
        left_out = _note(self.session_id, f"[{start} earlier messages were left out of the model's view to fit "
                                          "its window; the transcript keeps every one of them.]")
        first = start - has - self.skipped
        view = Rendered([left_out, *held[first:]], estimate_tokens(left_out) + self.cum[count] - self.cum[first])
        self._prune(fits)
        return view

    def _opening(self, state: str) -> Message:
        assert self.cut is not None
        block = cut_in(self.cut)
        if isinstance(block, CompactionBlock):
            text = state
            if block.summary:
                text = f"{text}\n\n{SUMMARY_HEADING}{block.summary}" if text else block.summary
        else:
            assert isinstance(block, ToolResultBlock)
            text = f"{state}\n\n{SUMMARY_PREFIX}{block.output}" if state else SUMMARY_PREFIX + block.output
        return _note(self.cut.session_id, text)

    def _prune(self, fits: int) -> None:
        """Let go of the held messages before ``fits`` once no request can include them again (see the
        class's docstring), when they are at least half of what is held (so each is moved once or so)."""
        if self.total <= self.limit * SAFETY:
            return
        count = min(fits, len(self.messages) - 1)
        if count <= 0 or 2 * count < len(self.messages):
            return
        base = self.cum[count]
        del self.messages[:count]
        self.cum = [c - base for c in self.cum[count:]]
        self.skipped += count
        self.from_start = False

    def prune(self) -> None:
        """Let go of what no request can include any more (``render`` does it as it goes)."""
        count = len(self.messages)
        self._prune(bisect_left(self.cum, self.cum[count] - int(self.limit * LOW_WATER)))

    # ---- what else the host asks of it -------------------------------------------------------------

    def in_view(self, seq: int) -> bool:
        """Whether the message ``seq`` is in the view as the transcript's last compaction left it: kept by
        it or after it (a NewContext cut aside, as the host's note has always judged it)."""
        if self.compaction is None:
            return True
        at, kept_from = self.compaction
        return at < seq or (kept_from is not None and seq >= kept_from)

    @property
    def tokens(self) -> int:
        """About how much this state holds, in estimated tokens."""
        return self.cum[-1] + (estimate_tokens(self.cut) if self.cut is not None else 0)

    def copy(self) -> ViewState:
        other = ViewState(self.limit)
        for name in self.__slots__:
            setattr(other, name, getattr(self, name))
        other.messages = list(self.messages)
        other.cum = list(self.cum)
        return other


def _compaction_ref(message: Message) -> tuple[int, int | None]:
    block = compaction_of(message)
    assert block is not None
    return message.seq, block.kept_from_seq


def _note(session_id: str, text: str) -> Message:
    return Message(id="m_context", session_id=session_id, turn_id=None, seq=0, role="user",
                   content=[TextBlock(text=text)], created_at="")
