"""The demo model (``--model demo``): a built-in, offline model that shows the whole product.

It reads the conversation like a model would and walks the contract flow on the
user's real project: asked for anything in Agent mode it enters Plan mode; in
Plan (or Goal) mode it looks around (Glob, then Read of a README or manifest)
and submits a real plan (or goal with criteria); once approved it carries it out
by writing a small ``NOTES.md``, and in a Goal execution reports every criterion.
Where nobody can approve a plan (an unattended run: the contract tools are
hidden or answer ``PLAN_REQUIRES_INTERACTIVE_SESSION``) it does that work
directly in Agent mode instead.
It never needs a network or a key, and every step goes through the host like a
real model's would.

It listens, a little: the plan quotes the request, and a revision after a
rejection takes the feedback in (a file the feedback names, like ``SUMMARY.md``,
becomes the file to write; the feedback itself becomes a step), so the revision
diff shows a real change offline. The execution writes the file the approved
plan names.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator
from typing import Any

from pidesk.core.records import Message, TextBlock, ToolCallBlock, ToolResultBlock
from pidesk.providers.base import Done, ModelRequest, StreamEvent, TextDelta, ToolCall, UsageReport

NOTES = "NOTES.md"
_WORDS = re.compile(r"\S+\s*")
_READ_FIRST = ("README.md", "README.rst", "README.txt", "README", "pyproject.toml", "package.json", "Cargo.toml")
CRITERIA = [f"{NOTES} exists at the project root", f"{NOTES} lists the project's files"]


class DemoProvider:
    name = "demo"

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamEvent, None]:
        text, calls = (_summary(request), []) if request.tool_choice == "none" else _next_step(request)
        for word in _WORDS.findall(text):
            yield TextDelta(word)
        for index, (name, args) in enumerate(calls):
            yield ToolCall(f"demo_{len(request.messages)}_{index}", name, args)
        yield UsageReport(input_tokens=_input_tokens(request), output_tokens=len(text) // 4)
        yield Done("tool_calls" if calls else "end")


def _input_tokens(request: ModelRequest) -> int:
    """What a real model would count of the request, at four characters a token: the system prompt and
    tool specs too (without them the window looked nearly empty, and a session never compacted)."""
    chars = len(request.system) + len(json.dumps(request.tools)) + sum(len(m.text()) for m in request.messages)
    return chars // 4


def _summary(request: ModelRequest) -> str:
    """A compaction's summary, as the demo model can write one: what was asked and what it did."""
    asked = [m.text() for m in request.messages[:-1] if m.role == "user" and m.text().strip()]
    done = sorted({b.name for m in request.messages for b in m.content if isinstance(b, ToolCallBlock)})
    goal = asked[-1][:300] if asked else "(nothing yet)"
    return (f"## Goal\n{goal}\n## Decisions\nThe demo model plans before it changes files.\n"
            f"## Files\n{', '.join(done) + ' used' if done else 'None touched yet.'}\n"
            f"## Open questions\nNone.\n## Next\nCarry on with the latest request.")


def _next_step(request: ModelRequest) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    tools = {spec["name"] for spec in request.tools}
    turn = _current_turn(request.messages)
    last = turn[-1] if turn else None
    if last is not None and last.role == "tool":
        result = next(b for b in last.content if isinstance(b, ToolResultBlock))
        refused = not result.ok and result.error_code not in (None, "FILE_NOT_FOUND")
        if refused and result.error_code != "PLAN_REQUIRES_INTERACTIVE_SESSION":  # that one: work directly
            return f"The host refused {result.name} ({result.error_code}). I'll stop here.", []
    if "ReportCriteria" in tools:  # a Goal execution
        if not _called(turn, "Write"):
            return "Working toward the goal: writing the notes.", [("Write", _notes_args(request.messages))]
        return "Both criteria are verifiable now.", [("ReportCriteria", {"results": [
            {"criterion": c, "outcome": "met", "evidence": f"{NOTES} was written in this turn"} for c in CRITERIA]})]
    if _is_execution(turn):
        target = _approved_target(turn[0].text())
        if not _called(turn, "Write"):
            return "Carrying out the approved plan.", [("Write", _notes_args(request.messages, target))]
        return f"Done: {target} is written, as the plan said.", []
    kind = "goal" if "SubmitGoal" in tools else "plan" if "SubmitPlan" in tools else None
    if kind is None:
        if "EnterPlanMode" in tools and not _refused(turn, "PLAN_REQUIRES_INTERACTIVE_SESSION"):
            return "This changes files, so I'll plan it first.", [("EnterPlanMode", {"reason": "propose before writing"})]
        if "Write" in tools:  # an unattended run (nobody to approve a plan), or a scratch session
            return _work_directly(turn, request.messages)
        return "I can only help with a project session.", []
    if not _called(turn, "Glob"):
        return "Let me look at the project.", [("Glob", {"pattern": "**/*"})]
    if not _called(turn, "Read"):
        listing = _last_result(turn, "Glob")
        first = next((name for name in _READ_FIRST if name in listing.splitlines()), None)
        if first is not None:
            return f"Reading {first}.", [("Read", {"path": first, "limit": 40})]
    return _submit(kind, _last_result(turn, "Glob"), _request(request.messages), _feedback(request.messages))


def _submit(kind: str, listing: str, asked: str, feedback: str | None) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    files = _files(listing)[:12]
    shown = "\n".join(f"- `{name}`" for name in files) or "- (no files)"
    if kind == "plan":
        target = _named_file(feedback or "") or _named_file(asked) or NOTES
        steps = [f"Write `{target}` with a short description and the list above.", "Change nothing else."]
        revised = ""
        if feedback:
            steps.insert(1, f"Follow your feedback: {feedback}")
            revised = f"## Revised after your feedback\n\n> {feedback}\n\n"
        numbered = "".join(f"{n}. {step}\n" for n, step in enumerate(steps, 1))
        markdown = (f"# Write {target}\n\nYou asked: “{asked}”.\n\n{revised}The project's files:\n\n{shown}\n\n"
                    f"## Steps\n\n{numbered}")
        say = "I revised the plan with your feedback." if feedback else "Here is my plan."
        return say, [("SubmitPlan", {"title": f"Write {target}", "markdown": markdown,
                                     "question": f"May I write {target}?"})]
    criteria = "\n".join(f"- {c}" for c in CRITERIA)
    markdown = (f"# Goal: a {NOTES} for this project\n\n## Acceptance criteria\n\n{criteria}\n\n"
                "## Boundaries\n\n- Only NOTES.md is created; nothing else changes.\n")
    return "Here is the goal.", [("SubmitGoal", {"title": f"A {NOTES} for this project", "markdown": markdown,
                                                 "question": "Approve this goal?", "criteria": CRITERIA})]


def _work_directly(turn: list[Message], messages: list[Message]) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """Agent-mode work without a contract: look around, write the notes, say so."""
    if not _called(turn, "Glob"):
        return "Nobody can approve a plan here, so I'll do the work directly. Looking at the project.", [
            ("Glob", {"pattern": "**/*"})]
    if not _called(turn, "Write"):
        return f"Writing {NOTES}.", [("Write", _notes_args(messages))]
    return f"Done: {NOTES} is written.", []


def _refused(turn: list[Message], code: str) -> bool:
    return any(isinstance(b, ToolResultBlock) and b.error_code == code for m in turn for b in m.content)


def _notes_args(messages: list[Message], target: str = NOTES) -> dict[str, Any]:
    listing = ""
    for message in messages:
        for block in message.content:
            if isinstance(block, ToolResultBlock) and block.name == "Glob" and block.ok:
                listing = block.output
    body = "\n".join(f"- {name}" for name in _files(listing)[:40]) or "- (empty)"
    title = target.rsplit("/", 1)[-1].split(".", 1)[0].replace("-", " ").replace("_", " ").capitalize() or "Notes"
    return {"path": target, "content": f"# {title}\n\nWritten by the pidesk demo model.\n\n## Files\n\n{body}\n"}


_FILE_NAME = re.compile(r"(?<![\w./-])([\w-]+\.(?:md|txt|rst))\b", re.IGNORECASE)
_APPROVED_TARGET = re.compile(r"^# Write (\S+)\s*$", re.MULTILINE)


def _named_file(text: str) -> str | None:
    """A plain file name the text mentions (``SUMMARY.md``), if any: the user's choice of file."""
    found = _FILE_NAME.search(text)
    return found.group(1) if found else None


def _approved_target(instruction: str) -> str:
    """The file the approved plan (carried in the execution's first message) says to write."""
    found = _APPROVED_TARGET.search(instruction)
    name = found.group(1).strip("`") if found else NOTES
    return name if _named_file(name) == name else NOTES


def _request(messages: list[Message]) -> str:
    """The user's current request — the newest prompt, not the session's first, nor the host's opening of
    a compacted view (seq 0) or an execution's instructions — on one line."""
    for message in reversed(messages):
        if message.role == "user" and message.seq > 0 and message.text().strip() \
                and not message.text().startswith("Approved "):
            return " ".join(message.text().split())[:200]
    return ""


def _feedback(messages: list[Message]) -> str | None:
    """The feedback of the latest rejected plan, if the agent has not submitted since."""
    for message in reversed(messages):
        for block in message.content:
            if isinstance(block, ToolResultBlock) and block.name in ("SubmitPlan", "SubmitGoal"):
                if block.error_code != "PLAN_REJECTED":
                    return None
                _, _, text = block.output.partition("Feedback: ")
                text = text.split("\nYou are still in ", 1)[0]  # (the host's own words after the user's)
                return " ".join(text.split()) or None
    return None


def _files(listing: str) -> list[str]:
    return [line for line in listing.splitlines() if line and not line.startswith(("[", ".pi/"))]


def _current_turn(messages: list[Message]) -> list[Message]:
    """The messages since the last user-authored prompt (tool results are role tool)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return messages[index:]
    return []


def _is_execution(turn: list[Message]) -> bool:
    return bool(turn) and turn[0].text().startswith("Approved ")


def _called(turn: list[Message], name: str) -> bool:
    return any(isinstance(b, ToolCallBlock) and b.name == name for m in turn for b in m.content)


def _last_result(turn: list[Message], name: str) -> str:
    for message in reversed(turn):
        for block in message.content:
            if isinstance(block, ToolResultBlock) and block.name == name:
                return block.output
    return ""


__all__ = ["CRITERIA", "DemoProvider"]
