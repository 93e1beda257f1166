"""What the agent is told: the system prompt and each session's first message.

A new session starts from the goal (verbatim, never a summary of it), the done-conditions, the
latest handoff, the latest check results and a short listing of the workspace: not from old
transcripts.
"""

from __future__ import annotations

from typing import Any

SYSTEM_PROMPT = """\
You are an autonomous software agent working toward one goal over many sessions. Each session is \
a bounded context window; between sessions you keep nothing but the handoff notes you write.

You work in a sandboxed workspace folder through the tools you are given. Paths are relative to \
the workspace. Commands run with a time limit and without network access.

The run is done only when the harness's done-conditions pass: shell checks that the harness runs \
itself when you call `finish`. Your own claim that the work is done is not enough; if a check \
fails you get its output and continue.

When the harness says the session is ending, call `handoff` with an honest summary, what is done, \
the next steps and open questions: the next session starts from that alone. People may send you \
notes; follow them."""

HANDOFF_REQUEST = (
    "This session has reached its limit ({why}). Stop the current task now and call the "
    "`handoff` tool: summary, what is done, next steps, open questions. The next session starts "
    "from your handoff, the goal and the workspace only."
)

NUDGE = (
    "You ended your turn without calling a tool. Keep working toward the goal with the tools; "
    "call `finish` when you believe the done-conditions pass."
)
NUDGE_MAX_TOKENS = (
    "Your last reply was cut off at the output token limit. Continue, in smaller steps."
)


def format_handoff(handoff: dict[str, Any]) -> str:
    lines = [handoff.get("summary", "").strip() or "(no summary)"]
    for title, key in (
        ("Done", "done"),
        ("Next steps", "next_steps"),
        ("Open questions", "open_questions"),
    ):
        items = handoff.get(key) or []
        if items:
            lines.append(f"\n{title}:")
            lines.extend(f"- {item}" for item in items)
    return "\n".join(lines)


def handoff_markdown(handoff: dict[str, Any]) -> str:
    """The handoff as a Markdown document (its artifact): each list under its own heading, with
    the blank lines Markdown needs to keep a list a list."""
    parts = [handoff.get("summary", "").strip() or "(no summary)"]
    for title, key in (
        ("Done", "done"),
        ("Next steps", "next_steps"),
        ("Open questions", "open_questions"),
    ):
        items = [" ".join(str(item).split()) for item in handoff.get(key) or []]
        if items:
            parts.append(f"## {title}\n\n" + "\n".join(f"- {item}" for item in items))
    return "\n\n".join(parts)


# The parts a first message is built from, in the order they appear (the wake-up record).
WAKE_UP_PARTS = (
    "goal",
    "done_conditions",
    "review_criteria",
    "acceptance",
    "session",
    "handoff",
    "checks",
    "memory",
    "changed_by_people",
    "rewind_note",
    "notes",
    "workspace",
)
# Tokens are estimated at 4 characters a token: no provider here has a tokenizer that works
# offline (Anthropic's counts tokens over the network), so every count says it is an estimate.
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def first_message(**kwargs: Any) -> str:
    return assemble(wake_up_parts(**kwargs))


def in_order(parts) -> list[str]:
    """The parts' names in the first message's order (PostgreSQL's jsonb keeps no key order)."""
    known = [name for name in WAKE_UP_PARTS if name in parts]
    return known + [name for name in parts if name not in WAKE_UP_PARTS]


def assemble(parts: dict[str, str]) -> str:
    """The first message from its parts: sections a blank line apart; a person's notes go
    under the rewind note's heading when there is one."""
    out = ""
    for name in in_order(parts):
        text = parts[name]
        if out:
            out += "\n" if name == "notes" and "rewind_note" in parts else "\n\n"
        out += text
    return out


def wake_up_record(parts: dict[str, str]) -> dict[str, dict[str, Any]]:
    """What a session knew at wake-up: each part's text and its size (estimated)."""
    return {
        name: {"text": text, "tokens": estimate_tokens(text), "estimated": True}
        for name, text in parts.items()
    }


def wake_up_parts(
    *,
    goal: str,
    checks: list[str],
    rubric: str,
    session_index: int,
    max_sessions: int | None,
    max_turns: int,
    handoff: dict[str, Any] | None,
    check_results: list[dict[str, Any]],
    listing: str,
    notes: list[str] | None = None,
    acceptance: list[dict[str, Any]] | None = None,
    rewind_note: str = "",
    memory: str = "",
    changed_by_people: list[str] | None = None,
) -> dict[str, str]:
    """The first message's sections by name (WAKE_UP_PARTS), those that apply, in order."""
    parts = {"goal": f"# Goal\n{goal}"}
    check_lines = "\n".join(f"- `{c}`" for c in checks) or "- (none)"
    parts["done_conditions"] = (
        "# Done-conditions (run by the harness when you call `finish`; all must pass)\n"
        + check_lines
    )
    if rubric:
        parts["review_criteria"] = (
            f"# Review criteria (an independent judge checks these)\n{rubric}"
        )
    if acceptance:
        lines = [
            f"- [{'x' if c['passing'] else ' '}] {c['name']}"
            + (f" (checked by `{c['check']}`)" if c.get("check") else "")
            for c in acceptance
        ]
        passing = sum(c["passing"] for c in acceptance)
        parts["acceptance"] = (
            f"# Acceptance criteria ({passing} of {len(acceptance)} passing; only the harness marks one passing)\n"
            + "\n".join(lines)
        )
    of = f" of at most {max_sessions}" if max_sessions else ""
    parts["session"] = (
        f"# This session\nSession {session_index}{of}; up to {max_turns} turns before you are "
        "asked to hand off."
    )
    if handoff:
        parts["handoff"] = f"# Handoff from the previous session\n{format_handoff(handoff)}"
    elif session_index == 1:
        parts["handoff"] = "# Handoff\nThis is the first session: nothing has been done yet."
    if check_results:
        lines = []
        for r in check_results:
            state = "passed" if r["passed"] else f"FAILED (exit {r['exit_code']})"
            tail = r.get("output", "")[-1500:].rstrip()
            lines.append(
                f"- `{r['command']}`: {state}"
                + (f"\n```\n{tail}\n```" if tail and not r["passed"] else "")
            )
        parts["checks"] = "# Latest check results\n" + "\n".join(lines)
    if memory:
        parts["memory"] = memory
    if changed_by_people:
        parts["changed_by_people"] = (
            "# Memory changed by people since your last session\n"
            + "\n".join(f"- {line}" for line in changed_by_people)
        )
    heading = "# Notes from people\n"
    if rewind_note:
        parts["rewind_note"] = heading + f"- {rewind_note}"
    if notes:
        items = "\n".join(f"- {n}" for n in notes)
        parts["notes"] = items if rewind_note else heading + items
    parts["workspace"] = f"# Workspace\n{listing or '(empty)'}"
    return parts
