from __future__ import annotations

import json
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from agents import events, overview, policy, verification
from agents.fleets import tree as fleets
from agents.management.base import RunCommand, get_run, id_arg
from agents.models import ApprovalStatus, EventKind, Run
from agents.runtime import prompts


def run_summary(run) -> dict:
    sessions = [
        {
            "index": s.index,
            "status": s.status,
            "end_reason": s.end_reason,
            "turns": s.turns,
            "input_tokens": s.input_tokens,
            "output_tokens": s.output_tokens,
            "cost_usd": str(s.cost_usd),
            "handoff": s.handoff,
            "wake_up": s.wake_up,
        }
        for s in run.sessions.order_by("index")
    ]
    return {
        "id": run.pk,
        "goal": run.goal,
        "status": run.status,
        "reason": run.status_reason,
        "pause_cause": run.pause_cause,
        "provider": run.provider,
        "project": run.project,
        "offline": run.is_offline,
        "external": run.is_external,
        "last_contact_at": run.last_contact_at.isoformat() if run.last_contact_at else None,
        "heartbeat_seconds": run.heartbeat_window if run.is_external else None,
        "stalled": run.stalled,
        "model": run.model,
        "checks": run.checks,
        "isolation": run.isolation,
        "unisolated": run.unisolated,
        "limits": run.limits,
        "toolchain": run.toolchain,
        "workspace": str(run.workspace_path),
        "workspace_tree": run.workspace_tree or None,
        "created_at": run.created_at.isoformat(),
        "usage": {
            "turns": run.turns,
            "input_tokens": run.input_tokens,
            "output_tokens": run.output_tokens,
            "cache_read_tokens": run.cache_read_tokens,
            "cache_write_tokens": run.cache_write_tokens,
            "total_tokens": run.total_tokens,
            "cost_usd": str(run.cost_usd),
            "cost_estimated": run.cost_estimated,
            "active_seconds": round(run.active_seconds, 1),
        },
        "budgets": {
            "max_sessions": run.max_sessions,
            "max_tokens": run.max_tokens,
            "max_cost_usd": str(run.max_cost_usd) if run.max_cost_usd is not None else None,
            "max_wall_seconds": run.max_wall_seconds,
            "max_turns_per_session": run.max_turns_per_session,
        },
        "tool_policy": run.tool_policy,
        "global_tool_policy": settings.SHIFTLOG["TOOL_POLICY"],
        "webhook_urls": run.webhook_urls,
        # The run's own Slack settings ("" / null: its project's; [] no run news).
        "slack": {"channel": run.slack_channel, "news": run.slack_news},
        "sessions": sessions,
        "rubric": run.rubric,
        "protected": sorted(run.protected),
        "acceptance": run.acceptance,
        "progress": [
            {
                "seq": e.seq,
                "session": e.session.index if e.session else None,
                "passing": events.payload_of(e).passing,
                "total": events.payload_of(e).total,
            }
            for e in run.events.filter(kind=EventKind.ACCEPTANCE_UPDATED)
            .select_related("session")
            .order_by("seq")
        ],
        "checks_history": verification.check_history(run.pk),
        "regressions": [
            e.payload for e in run.events.filter(kind="check.regressed").order_by("seq")
        ],
        "checkpoints": [
            {
                "number": c.number,
                "id": c.pk,
                "seq": c.seq,
                "kind": c.kind,
                "label": c.label,
                "checks": (c.state or {}).get("checks", {}),
            }
            for c in run.checkpoints.order_by("seq")
        ],
        "pending_approvals": [
            {"id": a.pk, "tool": a.tool_name, "input": a.tool_input}
            for a in run.approvals.filter(status=ApprovalStatus.PENDING)
        ],
        "events": run.last_seq,
        "parent": run.parent_id,
        "depth": run.depth,
        # What made it, when not a person directly.
        "schedule": run.schedule_id,
        "trigger": run.trigger_id,
        "forked_from": (
            {"run": run.forked_from.run_id, "checkpoint": run.forked_from.number}
            if run.forked_from_id
            else None
        ),
        "children": list(run.children.order_by("pk").values_list("pk", flat=True)),
        "rollup": fleets.rollup(run).as_json(),
    }


def tree_lines(run, depth: int = 0) -> list[str]:
    """The fleet below `run`, one line a run, indented by level."""
    lines = []
    for child in Run.objects.filter(parent=run).order_by("pk"):
        spent = fleets.rollup(child)
        lines.append(
            f"  {'  ' * depth}└ run {child.pk}: {child.status}, {spent.tokens} tokens, "
            f"${spent.cost_usd} — {child.goal[:60]}"
        )
        lines += tree_lines(child, depth + 1)
    return lines


def contact(data: dict) -> str:
    """An external run's agent: its last call and whether it has gone silent too long."""
    seen = data["last_contact_at"]
    if seen:
        quiet = (timezone.now() - datetime.fromisoformat(seen)).total_seconds()
        text = f"last contact {seen} ({overview.duration(quiet).removeprefix('~')} ago)"
    else:
        text = "no contact yet"
    text += f", heartbeat {data['heartbeat_seconds']} s"
    if data["stalled"]:
        text += "  ** STALLED: silent for longer than its heartbeat **"
    return text


class Command(RunCommand):
    help = "Show a run: status, reason, sessions, usage, cost, checkpoints, pending approvals."

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=id_arg, metavar="ID")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        data = run_summary(get_run(o["run_id"]))
        if o["json"]:
            self.stdout.write(json.dumps(data, indent=2))
            return
        w = self.stdout.write
        w(
            f"Run {data['id']}: {data['status']}"
            + (f" — {data['reason']}" if data["reason"] else "")
        )
        w(f"  goal:      {data['goal']}")
        if data["project"]:
            w(f"  project:   {data['project']}")
        label = {"scripted": " (offline)", "external": " (an agent driving it through the API)"}
        label = label.get(data["provider"], "")
        w(
            f"  provider:  {data['provider']}{label}, model {data['model']}, isolation {data['isolation'] or '-'}"
            + (
                "  ** UNISOLATED: its commands have the worker's own reach **"
                if data["unisolated"]
                else ""
            )
        )
        if data["external"]:
            w(f"  agent:     {contact(data)}")
        w(f"  checks:    {'; '.join(data['checks'])}")
        u = data["usage"]
        w(
            f"  usage:     {u['turns']} turns, {u['total_tokens']} tokens "
            f"({u['input_tokens']} in, {u['output_tokens']} out), ${u['cost_usd']}"
            + (
                " (estimated: a model in no price table, priced at the dearest rate)"
                if u["cost_estimated"]
                else ""
            )
            + f", {u['active_seconds']} s"
        )
        if data["parent"]:
            w(f"  parent:    run {data['parent']} (depth {data['depth']} of its fleet)")
        if data["children"]:
            r = data["rollup"]
            w(f"  fleet:     {r['tokens']} tokens, ${r['cost_usd']} with its children")
            for line in tree_lines(get_run(data["id"])):
                w(line)
        w(f"  workspace: {data['workspace']}")
        w(f"  events:    {data['events']}")
        for s in data["sessions"]:
            state = (
                events.SESSION_ENDINGS.get(s["end_reason"], f"ended ({s['end_reason']})")
                if s["end_reason"]
                else s["status"]
            )
            w(f"  session {s['index']}: {state}, {s['turns']} turns")
            if s["wake_up"]:
                parts = s["wake_up"]
                sizes = ", ".join(f"{k} {parts[k]['tokens']}" for k in prompts.in_order(parts))
                total = sum(v["tokens"] for v in s["wake_up"].values())
                w(f"    wake-up: ≈ {total} tokens (estimate): {sizes}")
            if s["handoff"]:
                w(f"    handoff: {s['handoff'].get('summary', '')}")
        if data["acceptance"]:
            passing = sum(c["passing"] for c in data["acceptance"])
            w(f"  acceptance: {passing} of {len(data['acceptance'])} passing")
            for c in data["acceptance"]:
                w(f"    [{'x' if c['passing'] else ' '}] {c['name']}")
        for g in data["regressions"]:
            w(f"  REGRESSION: `{g['command']}` passed at #{g['passed_at_seq']} and failed later")
        for c in data["checkpoints"]:
            w(f"  checkpoint {c['number']} at #{c['seq']} ({c['kind']}) {c['label']}")
        rules = data["tool_policy"] + data["global_tool_policy"]
        w(
            f"  policy:    {len(rules)} rule(s); risky bash commands ask"
            if rules
            else "  policy:    default (risky bash commands ask)"
        )
        for rule in rules:
            w(f"    {rule.get('note') or policy.describe_rule(rule)}")
        for a in data["pending_approvals"]:
            w(f"  approval {a['id']} waiting: {a['tool']} {json.dumps(a['input'])[:100]}")
            w(
                f"    decide: manage.py approve {a['id']} --user NAME  |  manage.py deny {a['id']} --user NAME --reason TEXT"
            )
