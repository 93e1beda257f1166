"""A change to how the checks run, held for a person: the agent's edits to test-runner settings
(pytest.ini, pytest.toml, [tool.pytest*] in pyproject.toml, tox.ini, setup.cfg, noxfile.py,
conftest.py anywhere, ...; agents/check_settings.py) or to a protected test file
(agents/verification.py) are never used by the checks unless a person approved them.

At a check the harness puts the baseline back as before, and what it took out of the agent's
work here (`held_settings`, `held_protected`) becomes one approval (ApprovalSubject.CONFIG_CHANGE,
`request_input`): the card shows each file's diff against what the checks use now. Approving it
(`apply`, inside agents.approvals' decision) makes the approved content, by its hash, the run's
new baseline for those files — `Run.check_settings` / `Run.protected`, run state, so a rewind
keeps it and a fork copies it; the content the checks used before is remembered in the entry's
"replaced" list, so the copy the harness put back earlier is not taken for a new change
(`leftover`). Denying keeps the baseline; the agent is told the reason. A later, different edit
is a new change set (`call_id`), asked again; the same one is never asked twice.

Start-up code (sitecustomize.py, .pth files), shims and what would run in place of the source
(agents/suite_guard.py) are not settings a person approves: they stay put back, or block.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents import blobstore, check_settings

TOOL = "config_change"
# Settings files of a test runner (start-up hooks are not: they run code, they configure nothing).
STARTUP = frozenset({"sitecustomize.py", "usercustomize.py"})
RUNNER_FILES = (check_settings.SETTINGS_FILES - STARTUP) | {check_settings.PYPROJECT}
SETTINGS_KINDS = frozenset({"test settings", "pyproject.toml's [tool.pytest]"})
DIFF_LIMIT = 20_000  # characters of one file's diff on the card
SETTINGS, PROTECTED = "test-runner settings", "a protected file"
ABSENT = "absent"  # in an entry's "replaced": the checks used no file there before


@dataclass
class Held:
    """One file of the agent's change that the checks did not use."""

    path: str
    change: str  # added, modified, deleted, ...
    what: str  # SETTINGS or PROTECTED
    data: bytes | None  # the agent's version; None when it took the file out
    mode: int = 0o644


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _regular(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def leftover(workspace: Path, prints: dict[str, Any], rel: str) -> bool:
    """Whether the workspace holds, at `rel`, content the checks used before a person approved
    a change (the harness's own put-back, not the agent's work)."""
    replaced = (prints.get(rel) or {}).get("replaced") or []
    path = Path(workspace) / rel
    if not path.exists() and not path.is_symlink():
        return ABSENT in replaced
    return bool(replaced) and _regular(path) and digest(path.read_bytes()) in replaced


def held_settings(workspace: Path, found: list[dict[str, Any]]) -> list[Held]:
    """The test-runner settings among check_settings.changes' finds, read before they are put
    back (what a person may approve)."""
    held = []
    for c in found:
        if c["kind"] not in SETTINGS_KINDS or c["path"].rsplit("/", 1)[-1] not in RUNNER_FILES:
            continue
        path = Path(workspace) / c["path"]
        if _regular(path):
            held.append(Held(c["path"], c["change"], SETTINGS, path.read_bytes()))
        elif not path.exists() and not path.is_symlink():
            held.append(Held(c["path"], c["change"], SETTINGS, None))
    return held


def held_protected(
    workspace: Path, prints: dict[str, Any], changes: list[dict[str, Any]]
) -> list[Held]:
    """The protected files among verification.tampered's finds: files modified, added or taken
    out (not links, nor folders replaced), read before they are put back."""
    held = []
    for c in changes:
        rel = c["path"]
        if rel.endswith("/") or (prints.get(rel) or {}).get("folder"):
            continue
        if rel.rsplit("/", 1)[-1] in STARTUP or rel.endswith(".pth"):
            continue  # start-up code: never a person's to approve (it stays put back)
        path = Path(workspace) / rel
        if _regular(path):
            mode = path.stat().st_mode & 0o777
            held.append(Held(rel, c["change"], PROTECTED, path.read_bytes(), mode))
        elif rel in prints and not path.exists() and not path.is_symlink():
            held.append(Held(rel, c["change"], PROTECTED, None))
    return held


def call_id(held: list[Held]) -> str:
    """The approval's tool_use_id: the same change set is the same approval (asked once)."""
    key = json.dumps(
        sorted((h.what, h.path, digest(h.data) if h.data is not None else "-") for h in held)
    )
    return f"config:{digest(key.encode())[:40]}"


def _text(data: bytes | None) -> str | None:
    if data is None:
        return ""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _in_use(entry: dict[str, Any] | None, what: str) -> bytes | None:
    """What the checks use now for a file (None: nothing, the file is not there for them)."""
    if not entry or (entry.get("absent") and not entry.get("blob")):
        return None
    digest = entry.get("blob") if what == SETTINGS else entry.get("hash")
    return blobstore.configured().get(digest) if digest else None


def file_diff(rel: str, before: bytes | None, after: bytes | None) -> str:
    a, b = _text(before), _text(after)
    if a is None or b is None:
        return f"--- a/{rel}\n+++ b/{rel}\n(binary: {len(before or b'')} -> {len(after or b'')} bytes)\n"
    lines = difflib.unified_diff(
        a.splitlines(keepends=True),
        b.splitlines(keepends=True),
        f"a/{rel} (what the checks use)" if before is not None else "/dev/null",
        f"b/{rel} (the agent's)" if after is not None else "/dev/null",
    )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    if len(text) > DIFF_LIMIT:
        text = text[:DIFF_LIMIT] + f"\n... ({len(text) - DIFF_LIMIT} more characters)\n"
    return text


def _entry(h: Held) -> dict[str, Any]:
    """The baseline entry the approved content becomes (see the module's docstring)."""
    store = blobstore.configured()
    if h.what == PROTECTED:
        if h.data is None:
            return {"hash": store.put(b""), "size": 0, "mode": 0o644, "absent": True}
        return {"hash": store.put(h.data), "size": len(h.data), "mode": h.mode}
    if h.data is None:
        return {"kind": "test settings", "hash": "", "absent": True}
    entry = {"kind": "test settings", "hash": digest(h.data), "blob": store.put(h.data)}
    if h.path.endswith(check_settings.PYPROJECT):
        table = check_settings._pytest_table(h.data)
        entry["kind"] = "pyproject.toml's [tool.pytest]"
        if table:
            entry["table"] = digest(table.encode())
        else:  # no test settings left: nothing the scan reports, the file itself is kept
            entry["absent"] = True
    return entry


def request_input(
    held: list[Held], settings: dict[str, Any], protected: dict[str, Any]
) -> dict[str, Any]:
    """The approval's tool_input: each file with its diff against what the checks use now and
    the baseline entry it becomes if approved."""
    files = []
    for h in held:
        prints = settings if h.what == SETTINGS else protected
        was = prints.get(h.path)
        f = {
            "path": h.path,
            "change": h.change,
            "what": h.what,
            "diff": file_diff(h.path, _in_use(was, h.what), h.data),
            "entry": _entry(h),
        }
        if h.what == PROTECTED and h.path.rsplit("/", 1)[-1] in RUNNER_FILES:
            # A protected conftest.py (tests/ is protected by default) is test settings too:
            # both baselines take the approved content, or the next check would ask again.
            f["settings_entry"] = _entry(Held(h.path, h.change, SETTINGS, h.data))
        files.append(f)
    return {"files": files}


def card_diff(tool_input: dict[str, Any]) -> str:
    """The card's diff: every file's, one after the other."""
    return "".join(
        f["diff"] or f"{f['path']}: {f['change']} (no difference in text)\n"
        for f in tool_input.get("files", [])
    )


def paths(tool_input: dict[str, Any]) -> str:
    return ", ".join(f["path"] for f in tool_input.get("files", []))


def apply(run, tool_input: dict[str, Any]) -> list[dict[str, str]]:
    """Make the approved content the run's baseline for each file (`run` was read under its row
    lock). Returns what changed, [{path, what, hash}], for the decision's event."""
    settings = dict(run.check_settings or {})
    protected = dict(run.protected or {})
    done = []
    for f in tool_input.get("files", []):
        _adopt(settings if f["what"] == SETTINGS else protected, f["path"], f["entry"])
        if f.get("settings_entry"):
            _adopt(settings, f["path"], f["settings_entry"])
        done.append({"path": f["path"], "what": f["what"], "hash": f["entry"].get("hash", "")})
    run.check_settings, run.protected = settings, protected
    type(run).objects.filter(pk=run.pk).update(check_settings=settings, protected=protected)
    return done


def _adopt(prints: dict[str, Any], rel: str, entry: dict[str, Any]) -> None:
    """`entry` becomes the baseline of `rel`, remembering what the checks used before."""
    was = prints.get(rel) or {}
    replaced = list(was.get("replaced") or [])
    if not was or (was.get("absent") and not was.get("blob")) or not was.get("hash"):
        replaced.append(ABSENT)  # the checks used no file there
    else:
        replaced.append(was["hash"])
    prints[rel] = {**entry, "replaced": replaced[-20:]}
