"""The run's network, under policy: an egress proxy for the slice's commands, each connection
decided by the run's rules (`policy.decide_network`), recorded as a `network.connection` event,
and a host the rules do not know asked of a person like a risky tool call.

The proxy never holds a command waiting: a connection that needs a person is refused at once (the
command sees a 403 saying so), and when the command has returned the harness asks — one approval
per new host — and the run waits, at zero compute, for the decision: allow once (the next
command may connect), allow for this run (a rule), or deny (a rule). The agent is told the
decision when the run goes on.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from django.conf import settings

from agents import approvals, policy
from agents.decision_words import refusal
from agents.models import (
    Approval,
    ApprovalStatus,
    ApprovalSubject,
    Event,
    EventKind,
)
from agents.runtime.slice import Slice
from agents.sandbox import addresses

if TYPE_CHECKING:
    from agents.sandbox.egress import EgressProxy

log = logging.getLogger(__name__)
# New hosts one command may put to people as questions; more are refused, logged, not asked.
MAX_QUESTIONS = 5


class Network:
    def __init__(self, s: Slice, isolation: str) -> None:
        self.s = s
        self.proxy: EgressProxy | None = None
        if isolation == "bwrap":  # a plain subprocess has the host's network: nothing to proxy
            # proxy.py (its HTTP machinery) loads only where a sandboxed slice runs: not in
            # the web, the CLI or a worker's start.
            from agents.sandbox.egress import EgressProxy  # noqa: PLC0415

            folder = Path(settings.DATA_DIR) / "egress" / f"run-{s.run_id}"
            self.proxy = EgressProxy(
                folder,
                self._decide,
                self._record,
                block_private=not settings.SHIFTLOG["EGRESS_ALLOW_PRIVATE"],
            )
        self.attempts: list[dict[str, Any]] = []  # appended by the proxy's threads
        self.once: set[str] = set()  # "host:port" a person allowed for the next command
        self._lock = threading.Lock()

    def start(self) -> None:
        if self.proxy is not None:
            self.proxy.start()

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()

    # --- called by the proxy, in its threads ---------------------------------------------
    def _decide(self, host: str, port: int) -> str:
        target = policy.network_target(host, port)
        with self._lock:
            if target in self.once:
                return "allow"
        return policy.decide_network(self.s.rules, host, port).action

    def _record(
        self, host: str, port: int, decision: str, up: int, down: int, reason: str = ""
    ) -> None:
        attempt = {
            "host": host,
            "port": port,
            "decision": decision,
            "bytes_up": up,
            "bytes_down": down,
            "at": time.time(),
        }
        if reason:
            attempt["reason"] = reason
        with self._lock:
            self.attempts.append(attempt)

    # --- after each command ---------------------------------------------------------------
    def after_command(self, command: str) -> list[Approval]:
        """Record the command's connections; ask about the new hosts. Returns the approvals a
        person must decide before the run goes on (empty: nothing to wait for)."""
        # The command's connections still open end now and are reported under it.
        limited = self.proxy.end_command() if self.proxy is not None else {}
        with self._lock:
            attempts, self.attempts = self.attempts, []
            used = {policy.network_target(a["host"], a["port"]) for a in attempts}
            self.once -= used  # allowed once: that command had its chance
        for reason, count in limited.items():  # refused at a cap: one event for them all
            attempts.append(
                {
                    "host": "",
                    "port": 0,
                    "decision": "limited",
                    "count": count,
                    "reason": reason,
                    "bytes_up": 0,
                    "bytes_down": 0,
                    "at": time.time(),
                }
            )
        if not attempts:
            return []
        s = self.s
        asked: dict[str, dict[str, Any]] = {}
        for a in attempts:
            # Only a host name someone could decide about becomes a question (the proxy refuses
            # the rest as "invalid"; this is the second check), and a few per command: a
            # command that tries a hundred new hosts does not put a hundred questions to people.
            if a["decision"] != "ask" or addresses.host_problem(a["host"]) is not None:
                continue
            target = policy.network_target(a["host"], a["port"])
            if target in asked:
                continue
            if len(asked) >= MAX_QUESTIONS:
                a["reason"] = f"not asked: more than {MAX_QUESTIONS} new hosts in one command"
                continue
            asked[target] = a
        s.append(*[s.event(EventKind.NETWORK_CONNECTION, a) for a in attempts])
        if not asked:
            return []
        flood = approvals.flood(s.run, len(asked))
        if flood:
            self._refuse_flood(flood, len(asked))
        calls = [
            (
                _call_id(target, s.known_seq),
                policy.NETWORK_TOOL,
                {"host": a["host"], "port": a["port"]},
                f"a command tried to connect to {target}, which this run has not been allowed "
                f"to reach: `{command[:200]}`",
            )
            for target, a in asked.items()
        ]
        created, appended = approvals.request(
            s.run,
            calls,
            session_id=s.session_id,
            seq=s.known_seq,
            actor=s.owner,
            lease_owner=s.owner,
            subject=ApprovalSubject.NETWORK_HOST,
        )
        s.absorb(appended)
        return list(created.values())

    def _refuse_flood(self, flood: str, hosts: int) -> NoReturn:
        """Too many new hosts to ask about: none is asked, the agent is told, the run pauses
        with the reason (connections to them were refused already)."""
        s = self.s
        text = (
            f"Connections to {hosts} new hosts were refused and not asked of a person: {flood}. "
            "Ask for fewer hosts at once."
        )
        appended = s.append(
            s.event(EventKind.HARNESS_MESSAGE, {"text": text, "reason": "approval_flood"})
        )
        s.conv.add_text(appended.events[0].seq, text)
        s.pause_at_limit(flood)

    # --- when the run goes on -------------------------------------------------------------
    def tell_decisions(self) -> None:
        """Tell the agent what people decided about hosts since it last heard, and take the
        allow-once grants into this slice."""
        s = self.s
        # The decisions first: most runs have none, and then the log is not read at all.
        decided = list(
            Approval.objects.filter(run_id=s.run_id, subject=ApprovalSubject.NETWORK_HOST)
            .exclude(status=ApprovalStatus.PENDING)
            .order_by("pk")
        )
        if not decided:
            return
        told = set(
            Event.objects.filter(
                run_id=s.run_id, kind=EventKind.HARNESS_MESSAGE, payload__reason="network_decision"
            ).values_list("payload__approval_id", flat=True)
        )
        for approval in (a for a in decided if a.pk not in told):
            target = policy.network_target(
                str(approval.tool_input.get("host", "")), approval.tool_input.get("port")
            )
            text = _decision_text(approval, target, s.rules)
            if approval.status == ApprovalStatus.APPROVED:
                with self._lock:
                    self.once.add(target)
            appended = s.append(
                s.event(
                    EventKind.HARNESS_MESSAGE,
                    {"text": text, "reason": "network_decision", "approval_id": approval.pk},
                )
            )
            s.conv.add_text(appended.events[0].seq, text)


def _call_id(target: str, seq: int) -> str:
    """The approval's tool_use_id (a column of 100 characters): the target when it fits, else
    its digest (the host and port are in the approval's tool_input either way)."""
    call_id = f"network:{target}:{seq}"
    if len(call_id) <= 100:
        return call_id
    return f"network:{hashlib.sha256(target.encode()).hexdigest()[:40]}:{seq}"


def _decision_text(approval: Approval, target: str, rules: list[dict[str, Any]]) -> str:
    if approval.status == ApprovalStatus.APPROVED:
        host, _, port = target.rpartition(":")
        lasting = policy.decide_network(rules, host, int(port or 0)).action == "allow"
        span = "for the rest of this run" if lasting else "for your next command"
        return (
            f"A person allowed connections to {target} {span}. Run the command that needed it "
            "again."
        )
    reason = refusal(approval)
    return f"Connections to {target} were not allowed ({reason}). Carry on without it."
