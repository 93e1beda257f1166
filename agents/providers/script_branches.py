"""Branch points in a script: the scripted agent reacting to what people did.

A script's `turns` may hold a branch point besides turns:

    {"branches": [{"when": {"denied": "keep|don't delete"}, "turns": [...]},
                  {"when": {"note": "alphabetic"}, "turns": [...]}],
     "else": [...]}

The first branch whose `when` holds plays its turns (every condition in it must hold); if none
does, `else` plays (without one, nothing); then the script carries on after the branch point.
Branch points nest. The conditions, each a case-insensitive Python regex (`""` matches anything):

- `denied`: a tool result since the agent's previous turn is a person's denial (or an expired
  approval) whose reason matches;
- `note`: a person's note in this session matches (one that arrived during the session, or one
  its first message carries);
- `rewind_note`: the session began from a rewind or a fork whose note matches.

The agent reads these from its request, as a model would: in the runtime's own words (below).
The script is flattened in document order, so a turn's `script_index` still says where the agent
is and the provider stays stateless; the turn that passes a branch point records `chose`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents import patterns

CONDITIONS = ("denied", "note", "rewind_note")
MAX_DEPTH = 20  # branch points inside branch points
MAX_TURNS = 10000  # turns in all, every branch counted
MATCHED_CHARS = 200  # of the text that matched, kept in the turn's meta

# The runtime's wording, which the agent reads (tests/test_script_branches.py drives real runs,
# so a change of wording there fails there):
# agents/runtime/gate.py, a person's denial or an expired approval as the call's result;
DENIAL = re.compile(
    r"\AA person denied this call: (?P<reason>.*)\. It did not run; carry on without it\.\Z",
    re.DOTALL,
)
# agents/runtime/conversation.py, a note that arrived during the session;
NOTE = re.compile(r"\AA note from (?P<author>.*?): (?P<text>.*)\Z", re.DOTALL)
# agents/runtime/prompts.py, the first message's notes (agents/runtime/sessions.py writes each
# "AUTHOR: TEXT", a rewind's or a fork's "(with the rewind to checkpoint N) NOTE");
NOTES_HEADING = "\n\n# Notes from people\n"
NEXT_HEADING = "\n\n# Workspace\n"
NOTE_ITEM = re.compile(r"^- ", re.MULTILINE)
REWIND_NOTE = re.compile(r"\A\(with the rewind to checkpoint \d+\) (?P<text>.*)\Z", re.DOTALL)
PERSONS_NOTE = re.compile(r"\A(?P<author>.*?): (?P<text>.*)\Z", re.DOTALL)


# --- checking ---------------------------------------------------------------------------------
def problem(script: dict[str, Any]) -> str | None:
    """What the schema cannot say about a script's branch points (it has passed the schema):
    a pattern that is not a regular expression, nesting too deep, too many turns in all."""
    count = 0

    def walk(items: list[Any], where: str, depth: int) -> str | None:
        nonlocal count
        for i, item in enumerate(items):
            at = f"{where}[{i}]"
            if "branches" not in item:
                count += 1
                if count > MAX_TURNS:
                    return f"{at}: the script has more than {MAX_TURNS} turns in all"
                continue
            if depth >= MAX_DEPTH:
                return f"{at}: branch points nest at most {MAX_DEPTH} deep"
            for j, branch in enumerate(item["branches"]):
                for name, pattern in branch["when"].items():
                    try:
                        patterns.compile_pattern(pattern, ignore_case=True)
                    except patterns.PatternError as e:
                        return (
                            f"{at}.branches[{j}].when.{name}: not a valid regular expression ({e})"
                        )
                found = walk(branch.get("turns", []), f"{at}.branches[{j}].turns", depth + 1)
                if found:
                    return found
            found = walk(item.get("else", []), f"{at}.else", depth + 1)
            if found:
                return found
        return None

    return walk(script["turns"], "turns", 0)


# --- what the agent has read --------------------------------------------------------------------
@dataclass
class Seen:
    """What people said, as the agent's request shows it."""

    denials: list[str] = field(default_factory=list)  # reasons, since the agent's previous turn
    notes: list[str] = field(default_factory=list)  # this session's notes
    rewind_notes: list[str] = field(default_factory=list)  # the rewind's or fork's

    def texts(self, condition: str) -> list[str]:
        return {"denied": self.denials, "note": self.notes, "rewind_note": self.rewind_notes}[
            condition
        ]


def read(messages: list[dict[str, Any]]) -> Seen:
    seen = Seen()
    last_turn = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    for i, message in enumerate(messages):
        if message["role"] != "user" or isinstance(message["content"], str):
            continue
        for j, block in enumerate(message["content"]):
            kind = block.get("type")
            if i == 0 and j == 0:
                _read_first_message(block.get("text", ""), seen)
            elif kind == "text" and (found := NOTE.match(block.get("text", ""))):
                seen.notes.append(found["text"])
            elif (
                kind == "tool_result"
                and i > last_turn
                and (found := DENIAL.match(_text_of(block.get("content", ""))))
            ):
                seen.denials.append(found["reason"])
    return seen


def _read_first_message(text: str, seen: Seen) -> None:
    end = text.rfind(NEXT_HEADING)
    start = text.rfind(NOTES_HEADING, 0, end if end >= 0 else len(text))
    if start < 0:
        return
    section = text[start + len(NOTES_HEADING) : end if end >= 0 else len(text)]
    for item in NOTE_ITEM.split(section)[1:]:
        item = item.rstrip("\n")
        if found := REWIND_NOTE.match(item):
            seen.rewind_notes.append(found["text"])
        elif found := PERSONS_NOTE.match(item):
            seen.notes.append(found["text"])


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return content if isinstance(content, str) else ""


def holds(when: dict[str, str], seen: Seen) -> dict[str, str] | None:
    """The text each condition matched, when all of them hold; else None."""
    matched = {}
    for condition, pattern in when.items():
        # RE2 (agents/patterns.py): the script's author's pattern on the agent's text.
        hit = next(
            (
                t
                for t in seen.texts(condition)
                if patterns.search_or(pattern, t, unreadable=False, ignore_case=True)
            ),
            None,
        )
        if hit is None:
            return None
        matched[condition] = hit[:MATCHED_CHARS]
    return matched


# --- the script, flattened --------------------------------------------------------------------
@dataclass
class Leaf:
    turn: dict[str, Any]
    index: int  # in document order: the script_index
    parent: Sequence
    pos: int


@dataclass
class Point:
    where: str
    branches: list[tuple[dict[str, str], Sequence]]
    otherwise: Sequence | None
    parent: Sequence
    pos: int


@dataclass
class Sequence:
    items: list[Leaf | Point]
    owner: Point | None  # the branch point it belongs to (None: the script's own turns)


class Plan:
    """A script's turns in document order, and the way from one to the next."""

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        self.flat: list[Leaf] = []
        self.root = self._sequence(turns, "turns", None)

    def _sequence(self, items: list[dict[str, Any]], where: str, owner: Point | None) -> Sequence:
        sequence = Sequence([], owner)
        for i, item in enumerate(items):
            at = f"{where}[{i}]"
            if "branches" not in item:
                leaf = Leaf(item, len(self.flat), sequence, i)
                self.flat.append(leaf)
                sequence.items.append(leaf)
                continue
            point = Point(at, [], None, sequence, i)
            sequence.items.append(point)
            for j, branch in enumerate(item["branches"]):
                turns = self._sequence(branch.get("turns", []), f"{at}.branches[{j}].turns", point)
                point.branches.append((branch["when"], turns))
            if "else" in item:
                point.otherwise = self._sequence(item["else"], f"{at}.else", point)
        return sequence

    def upcoming(
        self, last: int, choose: Callable[[Point], dict[str, Any]]
    ) -> tuple[Leaf | None, list[dict[str, Any]]]:
        """The turn after the one played last (-1: none yet), and the choices made on the way
        there (`choose` decides a branch point: {"at", "branch": i | "else" | "nothing",
        "matched"})."""
        if last >= len(self.flat):
            return None, []
        sequence, pos = (
            (self.root, 0) if last < 0 else (self.flat[last].parent, self.flat[last].pos + 1)
        )
        chose: list[dict[str, Any]] = []
        while True:
            if pos >= len(sequence.items):
                if sequence.owner is None:
                    return None, chose
                sequence, pos = sequence.owner.parent, sequence.owner.pos + 1
                continue
            item = sequence.items[pos]
            if isinstance(item, Leaf):
                return item, chose
            choice = choose(item)
            chose.append(choice)
            branch = choice["branch"]
            if isinstance(branch, int) and 0 <= branch < len(item.branches):
                target = item.branches[branch][1]
            else:
                target = item.otherwise if branch == "else" else None
            if target is None:
                pos += 1
            else:
                sequence, pos = target, 0


def chooser(
    messages: list[dict[str, Any]], earlier: list[dict[str, Any]]
) -> Callable[[Point], dict[str, Any]]:
    """Decide a branch point: as decided before (a choice a handoff carried), or by what the
    agent has read in `messages` (read once, and only when a branch point is reached)."""
    decided = {c.get("at"): c for c in earlier if isinstance(c, dict)}
    seen: list[Seen] = []

    def choose(point: Point) -> dict[str, Any]:
        if point.where in decided:
            return decided[point.where]
        if not seen:
            seen.append(read(messages))
        for i, (when, _) in enumerate(point.branches):
            matched = holds(when, seen[0])
            if matched is not None:
                return {"at": point.where, "branch": i, "matched": matched}
        return {"at": point.where, "branch": "else" if point.otherwise else "nothing"}

    return choose
