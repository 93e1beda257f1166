"""How often a person is asked: asks per 100 tool calls, with and without the sandbox's
allowance for code the classifier cannot read (agents/policy.py, `decide(sandboxed=...)`).

Two sessions are replayed through the tool policy a run gets by default (no rules of its own):
the demo's tool calls (agents/scripts/demo.json, the path on which its cleanup is approved) and
bench/sessions/real_repo.json (an agent's session on a Python repository, call by call). For
each call it asks `protected_paths.decide_call`, the gate's own decision, once as a worker
without bubblewrap (or an external agent) decides and once as one with it.

    .venv/bin/python bench/asks.py           # a table
    .venv/bin/python bench/asks.py --json    # the same as one JSON object
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shiftlog.settings")


def demo_calls() -> list[tuple[str, dict]]:
    """The demo's calls: its turns, then at its branch point the `else` (cleanup approved)."""
    from agents.providers.scripted import builtin_script

    calls = []
    for turn in builtin_script("demo")["turns"]:
        for t in turn.get("else", []) if "branches" in turn else [turn]:
            calls += [(c["name"], c.get("input", {})) for c in t.get("tool_calls", [])]
    return calls


def session_calls() -> list[tuple[str, dict]]:
    data = json.loads((HERE / "sessions" / "real_repo.json").read_text())
    return [(name, tool_input) for name, tool_input in data["calls"]]


def asks(calls: list[tuple[str, dict]], *, sandboxed: bool, workspace: Path) -> list[str]:
    """The reasons of the calls that would ask a person."""
    from agents import protected_paths, sandbox

    ws = sandbox.Workspace(workspace)
    found = []
    for name, tool_input in calls:
        decision = protected_paths.decide_call(
            [], name, tool_input, workspace=ws, sandboxed=sandboxed
        )
        if decision.action == "ask":
            found.append(f"{tool_input.get('command', name)[:60]!r}: {decision.reason}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="list each call that asks")
    args = parser.parse_args()
    import tempfile

    import django

    django.setup()
    figures = {}
    with tempfile.TemporaryDirectory() as workspace:
        for label, calls in (("demo", demo_calls()), ("real repository", session_calls())):
            before = asks(calls, sandboxed=False, workspace=Path(workspace))
            after = asks(calls, sandboxed=True, workspace=Path(workspace))
            figures[label] = {
                "calls": len(calls),
                "asks_before": len(before),
                "asks_after": len(after),
                "per_100_before": round(100 * len(before) / len(calls), 1),
                "per_100_after": round(100 * len(after) / len(calls), 1),
                "asked_before": before,
                "asked_after": after,
            }
    if args.json:
        print(json.dumps(figures))
        return 0
    print(f"{'session':<16} {'calls':>5} {'asks/100 before':>16} {'asks/100 after':>15}")
    for label, f in figures.items():
        print(
            f"{label:<16} {f['calls']:>5} {f['per_100_before']:>16} {f['per_100_after']:>15}"
            f"   ({f['asks_before']} → {f['asks_after']})"
        )
        if args.verbose:
            for side in ("before", "after"):
                for line in f[f"asked_{side}"]:
                    print(f"    {side}: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
