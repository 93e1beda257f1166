"""Verification the agent cannot talk its way past.

- A **judge**, separate from the agent: its own system prompt and (optionally) model. It sees the
  goal, the rubric, the workspace diff since the run began and the check output, never the
  agent's transcript or claims, and answers per criterion through a `verdict` tool.
- **Protected files** (the tests a check runs, say) are fingerprinted at creation. File tools may
  not change them; a change made some other way is found before the checks run, recorded as
  check.tampered, and the checks run against the originals, which are put back.
- A **ratchet**: a check that passed earlier on the live branch and fails now is a regression
  (check.regressed).
- **Acceptance criteria**: a list fixed at creation, each not passing until the harness (a check
  command, or the judge) says so; the agent reads it in its first message and cannot edit it.
- **Drift**: at each handoff, how much of the goal the handoff still speaks of (a lexical
  measure; the judge is not asked, so it works offline).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from agents.blobstore import BlobStore
from agents.models import Event, EventKind, Run
from agents.providers.base import ProviderError, TurnRequest

VERDICT_TOOL = {
    "name": "verdict",
    "description": "Give your verdict on every criterion: whether the work meets it, and why.",
    "input_schema": {
        "type": "object",
        "properties": {
            "criteria": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "criterion": {"type": "string"},
                        "passed": {"type": "boolean"},
                        "reason": {"type": "string"},
                    },
                    "required": ["criterion", "passed", "reason"],
                },
            }
        },
        "required": ["criteria"],
    },
}

JUDGE_SYSTEM = """\
You are a strict, independent reviewer. Another agent did the work below; you did not, and you \
owe it nothing. Judge only from the evidence given (the goal, the criteria, the diff of the \
workspace and the output of the checks), never from what anyone claims. For each criterion say \
whether it is met, with a short concrete reason. When the evidence does not show a criterion is \
met, it is not met. Answer with the `verdict` tool only."""

DIFF_LIMIT = 60_000


class JudgeUnavailable(Exception):
    pass


def criteria_of(run: Run) -> list[str]:
    """The rubric's criteria (one a line; bullets allowed) plus judged acceptance items."""
    lines = [
        re.sub(r"^\s*([-*•]|\d+[.)])\s*", "", line).strip() for line in run.rubric.splitlines()
    ]
    judged = [a["name"] for a in run.acceptance or [] if not a.get("check")]
    return [c for c in lines if c] + [c for c in judged if c not in lines]


@dataclass
class Verdict:
    criteria: list[dict[str, Any]]
    passed: bool
    model: str = ""
    error: str = ""
    usage: dict[str, int] = field(default_factory=dict)

    def failures(self) -> list[dict[str, Any]]:
        return [c for c in self.criteria if not c["passed"]]


def judge_message(
    run: Run, diff_text: str, check_results: list[dict[str, Any]], criteria: list[str]
) -> str:
    if len(diff_text) > DIFF_LIMIT:
        diff_text = diff_text[:DIFF_LIMIT] + f"\n[... diff cut at {DIFF_LIMIT} characters ...]"
    checks = "\n".join(
        f"- `{r['command']}`: {'passed' if r['passed'] else 'FAILED'}\n```\n{r.get('output', '')[-2000:]}\n```"
        for r in check_results
    )
    items = "\n".join(f"{i + 1}. {c}" for i, c in enumerate(criteria))
    return (
        f"# Goal\n{run.goal}\n\n# Criteria\n{items}\n\n# Checks (run by the harness)\n{checks}\n\n"
        f"# Workspace changes since the run began\n```diff\n{diff_text or '(no changes)'}\n```"
    )


def parse_verdict(turn_content: list[dict[str, Any]], criteria: list[str]) -> Verdict:
    call = next(
        (b for b in turn_content if b.get("type") == "tool_use" and b.get("name") == "verdict"),
        None,
    )
    if call is None or not isinstance(call.get("input", {}).get("criteria"), list):
        return Verdict(
            criteria=[
                {"criterion": c, "passed": False, "reason": "the judge gave no readable verdict"}
                for c in criteria
            ],
            passed=False,
            error="the judge did not answer with the verdict tool",
        )
    given = {}
    for item in call["input"]["criteria"]:
        if isinstance(item, dict) and isinstance(item.get("criterion"), str):
            given[_norm(item["criterion"])] = item
    out = []
    for i, criterion in enumerate(criteria):
        item = given.get(_norm(criterion))
        if item is None and i < len(call["input"]["criteria"]):
            candidate = call["input"]["criteria"][i]  # same order, reworded
            item = candidate if isinstance(candidate, dict) else None
        if item is None:
            out.append(
                {
                    "criterion": criterion,
                    "passed": False,
                    "reason": "the judge gave no verdict on it",
                }
            )
        else:
            out.append(
                {
                    "criterion": criterion,
                    "passed": item.get("passed") is True,
                    "reason": str(item.get("reason", "")),
                }
            )
    return Verdict(criteria=out, passed=all(c["passed"] for c in out))


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def run_judge(
    run: Run, provider, *, diff_text: str, check_results: list[dict[str, Any]], verdicts_so_far: int
) -> Verdict:
    """Ask the judge. Raises ProviderError like any model call (the run pauses or fails)."""
    criteria = criteria_of(run)
    request = TurnRequest(
        model=run.judge_model or run.model,
        system=JUDGE_SYSTEM,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": judge_message(run, diff_text, check_results, criteria)}
                ],
            }
        ],
        tools=[VERDICT_TOOL],
        max_tokens=2048,
        tool_choice={"type": "tool", "name": "verdict"},
        previous_meta={"judge_index": verdicts_so_far - 1},
    )
    turn = provider.judge(request) if hasattr(provider, "judge") else provider.next_turn(request)
    verdict = parse_verdict(turn.content, criteria)
    verdict.model = turn.model
    verdict.usage = turn.usage.as_dict()
    return verdict


# --- protected files --------------------------------------------------------------------------
def fingerprint(workspace, paths: list[str]) -> dict[str, dict[str, Any]]:
    """{path: {hash, size, mode}} for each protected file (folders expand to their files); the
    contents go into the blob store so the originals can be put back."""
    store = BlobStore()
    prints: dict[str, dict[str, Any]] = {}
    for rel in paths:
        target = workspace.resolve(rel)
        files = sorted(p for p in target.rglob("*") if p.is_file()) if target.is_dir() else [target]
        for path in files:
            data = path.read_bytes()
            prints[str(path.relative_to(workspace.path))] = {
                "hash": store.put(data),
                "size": len(data),
                "mode": path.stat().st_mode & 0o777,
            }
    return prints


def tampered(workspace, prints: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for rel, expected in prints.items():
        path = workspace.path / rel
        if path.is_symlink() or not path.is_file():
            found.append(
                {
                    "path": rel,
                    "expected": expected["hash"],
                    "found": None,
                    "change": "deleted or replaced",
                }
            )
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != expected["hash"]:
            found.append(
                {"path": rel, "expected": expected["hash"], "found": digest, "change": "modified"}
            )
    return found


def restore_originals(workspace, prints: dict[str, dict[str, Any]], paths: list[str]) -> None:
    store = BlobStore()
    for rel in paths:
        path = workspace.path / rel
        if path.is_symlink() or path.is_dir():
            import shutil

            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(store.get(prints[rel]["hash"]))
        path.chmod(prints[rel]["mode"])


def is_protected(prints: dict[str, dict[str, Any]], rel_path: str) -> bool:
    rel = rel_path.strip("/")
    while rel.startswith("./"):
        rel = rel[2:]
    return rel in prints


# --- ratchet ----------------------------------------------------------------------------------
def regressions(run_id: int, results: list[dict[str, Any]], live) -> list[dict[str, Any]]:
    """Checks failing now that passed before on the live branch."""
    failing = {r["command"] for r in results if not r["passed"]}
    if not failing:
        return []
    earlier = (
        Event.objects.filter(run_id=run_id, kind=EventKind.CHECK_RESULT, payload__passed=True)
        .filter(live)
        .order_by("seq")
        .values_list("seq", "payload")
    )
    passed_at: dict[str, int] = {}
    for seq, payload in earlier:
        passed_at.setdefault(payload["command"], seq)
    return [
        {"command": c, "passed_at_seq": passed_at[c]} for c in sorted(failing) if c in passed_at
    ]


def check_history(run_id: int, live) -> dict[str, list[dict[str, Any]]]:
    history: dict[str, list[dict[str, Any]]] = {}
    rows = (
        Event.objects.filter(run_id=run_id, kind=EventKind.CHECK_RESULT)
        .filter(live)
        .order_by("seq")
        .values_list("seq", "session__index", "payload")
    )
    for seq, session, payload in rows:
        history.setdefault(payload["command"], []).append(
            {
                "seq": seq,
                "session": session,
                "passed": payload["passed"],
                "at": payload.get("at", "finish"),
            }
        )
    return history


# --- drift ------------------------------------------------------------------------------------
STOPWORDS = frozenset(
    [
        "the",
        "and",
        "for",
        "with",
        "that",
        "this",
        "from",
        "into",
        "must",
        "should",
        "will",
        "have",
        "has",
        "are",
        "was",
        "were",
        "been",
        "be",
        "its",
        "their",
        "there",
        "then",
        "than",
        "them",
        "they",
        "you",
        "your",
        "our",
        "out",
        "not",
        "but",
        "all",
        "any",
        "can",
        "may",
        "also",
        "use",
        "using",
        "make",
        "made",
        "each",
        "which",
        "what",
        "when",
        "where",
        "who",
        "how",
        "why",
    ]
)
DRIFT_THRESHOLD = 0.2


def words(text: str) -> set[str]:
    return {
        w for w in re.findall(r"[a-z0-9_]+", text.lower()) if len(w) >= 3 and w not in STOPWORDS
    }


def goal_coverage(goal: str, handoff: dict[str, Any]) -> float:
    """How much of the goal's vocabulary the handoff still speaks of (0..1)."""
    goal_words = words(goal)
    if not goal_words:
        return 1.0
    text = " ".join(
        [
            handoff.get("summary", ""),
            *handoff.get("done", []),
            *handoff.get("next_steps", []),
            *handoff.get("open_questions", []),
        ]
    )
    return len(goal_words & words(text)) / len(goal_words)


__all__ = ["JudgeUnavailable", "ProviderError", "Verdict", "run_judge"]
