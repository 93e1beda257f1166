"""No secret reaches a run: a real worker whose environment holds canary secrets (API key,
metrics token, secret key, and the database and Redis addresses it really uses) drives a run
whose commands look everywhere a secret could be seen from inside (their environment, every
/proc/*/environ and cmdline they can see) and save what they found as an artifact. Then the
event log, the artifacts, every page of the run and the CLI's views are searched for the
canaries: none is there. A positive control shows the worker really had them."""

from __future__ import annotations

import json
import secrets
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from agents.blobstore import BlobStore
from agents.models import Artifact, Event, Run, RunStatus
from agents.sandbox import isolation_available
from tests.helpers import call, client_for, finish_turn, make_run
from tests.procs import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(isolation_available() != "bwrap", reason="bubblewrap is not usable here"),
]

LOOK = (
    "env > seen.txt; "
    "for f in /proc/self/environ /proc/1/environ /proc/[0-9]*/environ /proc/[0-9]*/cmdline; "
    "do tr '\\0' '\\n' < $f >> seen.txt 2>/dev/null; done; "
    "ls -la / /proc >> seen.txt; cat seen.txt"
)


def test_canary_secrets_in_the_workers_environment_reach_no_command_log_artifact_or_page(
    procs, supervisor
):
    canaries = {
        "ANTHROPIC_API_KEY": f"sk-ant-canary-{secrets.token_hex(8)}",
        "SHIFTLOG_METRICS_TOKEN": f"metrics-canary-{secrets.token_hex(8)}",
        "SECRET_KEY": f"secret-key-canary-{secrets.token_hex(16)}",
    }
    env = procs.env(**canaries)
    # The addresses of the services the worker uses (on PostgreSQL + Redis: real URLs).
    looked_for = {**canaries, **{k: env[k] for k in ("DATABASE_URL", "REDIS_URL") if env.get(k)}}
    run = make_run(
        turns=[
            {"tool_calls": [call("bash", command=LOOK)]},
            {"tool_calls": [call("save_artifact", path="seen.txt")]},
            finish_turn(),
        ],
        tool_policy=[{"tool": "bash", "action": "allow"}],
        created_by=supervisor,
    )
    worker = procs.consumer(name="worker", **canaries)
    # Positive control: the worker process really holds the canaries.
    held = Path(f"/proc/{worker.pid}/environ")
    wait_for(held.read_bytes, timeout=10, what="the worker to start")
    environ = held.read_bytes().decode()
    assert all(v in environ for v in canaries.values())
    procs.enqueue(run.pk)
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status in {"succeeded", "failed", "paused"},
        timeout=90,
        what="the run to end",
        details=procs.logs,
    )
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    seen = BlobStore().get(Artifact.objects.get(run=run, name="seen.txt").blob_hash).decode()
    assert "HOME=/home/agent" in seen  # the commands did look

    places = {
        "the event log": json.dumps(
            list(Event.objects.filter(run=run).values_list("payload", flat=True))
        ),
        "the artifacts": "".join(
            BlobStore().get(a.blob_hash).decode(errors="replace") for a in run.artifacts.all()
        ),
    }
    c = client_for(supervisor)
    pages = [
        "/",
        f"/runs/{run.pk}/?all=1",
        f"/runs/{run.pk}/events/?before={run.last_seq + 1}",
        "/approvals/",
        *[f"/runs/{run.pk}/artifacts/{a.pk}/" for a in run.artifacts.all()],
        f"/runs/{run.pk}/diff/?a={run.checkpoints.first().number}&b=live",
    ]
    for url in pages:
        response = c.get(url)
        assert response.status_code == 200, url
        places[url] = response.content.decode()
    for command, args in (("show_run", ["--json"]), ("tail_run", ["--json"])):
        out = StringIO()
        call_command(command, str(run.pk), *args, stdout=out)
        places[command] = out.getvalue()
    for where, text in places.items():
        for name, value in looked_for.items():
            assert value not in text, f"{name} found in {where}"
    assert settings.SECRET_KEY not in json.dumps(places)  # nor this process's own
