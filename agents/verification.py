"""Verification the agent cannot talk its way past.

- A **judge**, separate from the agent: its own system prompt and (optionally) model. It sees the
  goal, the rubric, the workspace diff since the run began and the check output, never the
  agent's transcript or claims, and answers per criterion through a `verdict` tool.
- **Protected files** (the tests a check runs, say) are fingerprinted at creation; a protected
  folder covers everything under it, files added later included. File tools may not change them;
  a change made some other way is found before the checks run, recorded as check.tampered, and
  the checks run against the originals, which are put back (added files are moved aside, kept
  as artifacts).
- A **ratchet**: a check that passed earlier on the live branch and fails now is a regression
  (check.regressed).
- **Acceptance criteria**: a list fixed at creation, each not passing until the harness (a check
  command, or the judge) says so; the agent reads it in its first message and cannot edit it.
- **Drift**: at each handoff, the agent's or one the harness forced, how much of the goal the
  handoff still speaks of (a lexical measure; the judge is not asked, so it works offline).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents import blobstore
from agents.models import Event, Run
from agents.protected_paths import is_folder, is_protected, protected_prefix
from agents.providers.base import ProviderError, Turn, TurnRequest

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
met, it is not met. Read the diff for work that games the checks rather than doing the goal: code that special-cases the tests' own inputs (answers looked up for the values the tests use, a branch on those values, on the test runner being loaded, or on the test's name), tests skipped, marked as expected failures or weakened. Where the change does that, no criterion is met, and say so in each reason. Answer with the `verdict` tool only."""

DIFF_LIMIT = 60_000


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
        f"# Workspace changes since the run began\n```diff\n{diff_text or '(no changes)'}\n```\n\n"
        "# Also answer\nDoes the change special-case the tests' inputs (or the test runner) "
        "instead of fixing the behaviour in general? If it does, fail every criterion."
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
    run: Run,
    provider,
    *,
    diff_text: str,
    check_results: list[dict[str, Any]],
    verdicts_so_far: int,
    ask: Callable[[Callable[[], Turn]], Turn] = lambda call: call(),
) -> Verdict:
    """Ask the judge. Raises ProviderError like any model call (the run pauses or fails).
    `ask` makes the call (a worker's slice keeps its lease meanwhile: Slice.call_model)."""
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
    turn = ask(
        (lambda: provider.judge(request))
        if hasattr(provider, "judge")
        else (lambda: provider.next_turn(request))
    )
    verdict = parse_verdict(turn.content, criteria)
    verdict.model = turn.model
    verdict.usage = turn.usage.as_dict()
    return verdict


# --- protected files --------------------------------------------------------------------------
# `run.protected` maps each protected file to {hash, size, mode} and each protected folder, keyed
# "path/", to the same plus "folder": true (its hash is that of its original listing). A folder
# protects everything under it, also files that were not there when the run was created: a
# conftest.py added later that skips every test is as much a change to the checks as an edit.

# Caches the checks themselves write into a protected folder. They are not the agent's work, so
# they are cleared before the checks run instead of being reported; clearing them also shuts a
# back door (a crafted .pyc carrying the original's stamp runs in place of the protected source).
CACHE_DIRS = frozenset({"__pycache__", ".pytest_cache"})


def fingerprint(workspace, paths: list[str]) -> dict[str, dict[str, Any]]:
    """{path: {hash, size, mode}} for each protected file, and an entry for each protected
    folder (see above) besides its files; the contents go into the blob store so the originals
    can be put back."""
    store = blobstore.configured()
    prints: dict[str, dict[str, Any]] = {}
    for rel in paths:
        target = workspace.resolve(rel)
        if not target.exists() and not target.is_symlink():
            # Not there yet: protected all the same, so creating it later is a change to the
            # checks (a conftest.py the agent adds). A trailing / protects a folder to be.
            key = target.relative_to(workspace.path).as_posix()
            folder = rel.endswith("/")
            prints[key + ("/" if folder else "")] = {
                "hash": store.put(b""),
                "size": 0,
                "mode": 0o755 if folder else 0o644,
                "absent": True,
                **({"folder": True, "links": []} if folder else {}),
            }
            continue
        if target.is_dir():
            found = [
                p
                for p in sorted(target.rglob("*"))
                if not CACHE_DIRS.intersection(p.relative_to(target).parts)
            ]
            files = [p for p in found if p.is_file()]
            listing = "".join(f"{p.relative_to(workspace.path).as_posix()}\n" for p in files)
            prints[f"{target.relative_to(workspace.path).as_posix()}/"] = {
                "hash": store.put(listing.encode()),
                "size": len(listing.encode()),
                "mode": target.stat().st_mode & 0o777,
                "folder": True,
                # Links to folders (or to nothing) that were there from the start: not
                # fingerprinted, as before, but not taken for added files either.
                "links": [
                    p.relative_to(workspace.path).as_posix()
                    for p in found
                    if p.is_symlink() and not p.is_file()
                ],
            }
        else:
            files = [target]
        for path in files:
            data = path.read_bytes()
            prints[path.relative_to(workspace.path).as_posix()] = {
                "hash": store.put(data),
                "size": len(data),
                "mode": path.stat().st_mode & 0o777,
            }
    return prints


def _replaced(workspace, key: str, fingerprint: dict[str, Any]) -> str | None:
    """The first folder on the way to a protected path (the folder itself, for a protected
    folder) that is now a symlink or a file. Nothing is read or written through it: it could
    lead anywhere, even outside the workspace."""
    parts = key.rstrip("/").split("/")
    if parts == ["."]:
        return None
    for i in range(1, len(parts) + (1 if is_folder(fingerprint) else 0)):
        rel = "/".join(parts[:i])
        path = workspace.path / rel
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            return rel
    return None


def _added(workspace, folder: str, prints: dict[str, dict[str, Any]]) -> list[str]:
    """Paths under a protected folder that were not there at creation (links are not followed;
    a link to a folder counts as one added path)."""
    top = workspace.path / protected_prefix(folder)
    if not top.is_dir():
        return []
    found = []
    for here, dirs, files in os.walk(top):
        links = [d for d in dirs if os.path.islink(os.path.join(here, d))]
        dirs[:] = [d for d in dirs if d not in links and d not in CACHE_DIRS]
        for name in [*links, *files]:
            rel = Path(here, name).relative_to(workspace.path).as_posix()
            if rel not in prints and rel not in prints[folder].get("links", ()):
                found.append(rel)
    return sorted(found)


def tampered(workspace, prints: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every change under protection: a protected file modified, deleted or replaced, a folder
    on the way to one turned into a link or a file, and files added under a protected folder."""
    found: dict[str, dict[str, Any]] = {}

    def record(rel: str, change: str, expected: str | None = None, digest: str | None = None):
        found.setdefault(
            rel, {"path": rel, "expected": expected, "found": digest, "change": change}
        )

    for rel, fp in prints.items():
        if (bad := _replaced(workspace, rel, fp)) is not None:
            record(bad, "replaced by a link or a file")
    broken = [f"{rel}/" for rel in found]  # what lies beyond them is not looked at
    for rel, expected in prints.items():
        if is_folder(expected):
            if not any(rel.startswith(b) for b in broken):
                for extra in _added(workspace, rel, prints):
                    path = workspace.path / extra
                    digest = None
                    if path.is_file() and not path.is_symlink():
                        digest = hashlib.sha256(path.read_bytes()).hexdigest()
                    record(extra, "added", digest=digest)
            continue
        path = workspace.path / rel
        if expected.get("absent"):
            if path.exists() or path.is_symlink():
                record(rel, "added")
            continue
        if any(rel.startswith(b) for b in broken) or path.is_symlink() or not path.is_file():
            record(rel, "deleted or replaced", expected["hash"])
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != expected["hash"]:
            record(rel, "modified", expected["hash"], digest)
    return list(found.values())


def restore_originals(
    workspace, prints: dict[str, dict[str, Any]], changes: list[dict[str, Any]]
) -> dict[str, bytes]:
    """Undo `tampered`'s changes: what stands where it should not (an added file, a link or a
    file in place of a folder) is taken out, then the protected files are written back from
    their originals. Returns the files taken out, {path: contents}, for the caller to keep."""
    store = blobstore.configured()
    moved: dict[str, bytes] = {}
    for change in changes:
        if change["path"] in prints:
            continue
        path = workspace.path / change["path"]
        if path.is_file() and not path.is_symlink():
            moved[change["path"]] = path.read_bytes()
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            path.unlink()
    for change in changes:
        rel = change["path"]
        if rel not in prints:
            continue
        path = workspace.path / rel
        if prints[rel].get("absent"):  # it was not there: take it out, keep what it held
            if path.is_file() and not path.is_symlink():
                moved[rel] = path.read_bytes()
            if path.is_symlink() or path.is_file():
                path.unlink()
            elif path.is_dir():
                shutil.rmtree(path)
            continue
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(store.get(prints[rel]["hash"]))
        path.chmod(prints[rel]["mode"])
    return moved


def clear_caches(workspace, prints: dict[str, dict[str, Any]]) -> None:
    """Remove the CACHE_DIRS under protected folders (call it once `tampered` finds nothing
    replaced, so no link is on the way)."""
    for rel, fingerprint in prints.items():
        if not is_folder(fingerprint) or _replaced(workspace, rel, fingerprint) is not None:
            continue
        top = workspace.path / protected_prefix(rel)
        for here, dirs, _files in os.walk(top):
            for name in [d for d in dirs if d in CACHE_DIRS]:
                dirs.remove(name)
                path = Path(here, name)
                if path.is_symlink():
                    path.unlink()
                else:
                    shutil.rmtree(path)


# --- ratchet ----------------------------------------------------------------------------------
def regressions(run_id: int, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Checks failing now that passed before on the live branch."""
    failing = {r["command"] for r in results if not r["passed"]}
    if not failing:
        return []
    earlier = (
        Event.objects.check_results(run_id)
        .filter(payload__passed=True)
        .values_list("seq", "payload")
    )
    passed_at: dict[str, int] = {}
    for seq, payload in earlier:
        passed_at.setdefault(payload["command"], seq)
    return [
        {"command": c, "passed_at_seq": passed_at[c]} for c in sorted(failing) if c in passed_at
    ]


def check_history(run_id: int) -> dict[str, list[dict[str, Any]]]:
    """Every check's results on the live branch, in order: `show_run --json`'s history."""
    history: dict[str, list[dict[str, Any]]] = {}
    rows = Event.objects.check_results(run_id).values_list("seq", "session__index", "payload")
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


def handoff_text(handoff: dict[str, Any]) -> str:
    """The part of a handoff that is the agent's own account of where the work stands.

    A handoff the harness forced (the agent ignored the request for one) has no restated goal:
    its summary is the harness's own boilerplate, which says nothing about the work. The agent's
    last words stand in for it; when there are none, nothing shows the session still worked
    toward the goal, so the coverage is 0 and the drift warning is recorded for a person to see.
    """
    if handoff.get("forced"):
        return handoff.get("last_text") or ""
    return " ".join(
        [
            handoff.get("summary", ""),
            *handoff.get("done", []),
            *handoff.get("next_steps", []),
            *handoff.get("open_questions", []),
        ]
    )


def goal_coverage(goal: str, handoff: dict[str, Any]) -> float:
    """How much of the goal's vocabulary the handoff still speaks of (0..1)."""
    goal_words = words(goal)
    if not goal_words:
        return 1.0
    return len(goal_words & words(handoff_text(handoff))) / len(goal_words)


def drift(goal: str, handoff: dict[str, Any]) -> dict[str, Any] | None:
    """The drift.warning payload when a handoff has parted from the goal; None when it has not.
    Every handoff, the agent's or the harness's, is measured here."""
    coverage = goal_coverage(goal, handoff)
    if coverage >= DRIFT_THRESHOLD:
        return None
    text = handoff_text(handoff)
    return {
        "coverage": round(coverage, 3),
        "threshold": DRIFT_THRESHOLD,
        "goal_words_missing": sorted(words(goal) - words(text))[:30],
        "summary": text[:500],
        "forced": bool(handoff.get("forced")),
    }


__all__ = ["ProviderError", "Verdict", "is_protected", "run_judge"]
