"""Three "machines" sharing only PostgreSQL, Redis and an S3 bucket (moto's server): each process
runs in a mount namespace of its own, with its own data and workspace folders and the others'
covered by an empty tmpfs, so none can read another's files. A worker killed mid-tool after
several committed writes is replaced by a worker on another machine, which restores the
workspace from the bucket and finishes the run; a third machine's CLI shows its diffs and
artifacts; no blob lands in any local folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from agents.models import Event, Run, RunStatus
from tests.procs import BASE_DIR, Procs, dump_events, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

UNSHARE = shutil.which("unshare")

SCRIPT = {
    "name": "three hosts",
    "turns": [
        {
            "text": "a",
            "tool_calls": [{"name": "write_file", "input": {"path": "a.txt", "content": "A\n"}}],
        },
        {
            "text": "b",
            "tool_calls": [{"name": "write_file", "input": {"path": "b.txt", "content": "B\n"}}],
        },
        {
            "text": "c",
            "tool_calls": [
                {"name": "bash", "input": {"command": "mkdir -p sub && echo C > sub/c.txt"}},
                {"name": "save_artifact", "input": {"path": "b.txt", "name": "notes-b"}},
            ],
        },
        {
            "text": "slow",
            "tool_calls": [{"name": "bash", "input": {"command": "echo half > e.txt; sleep 60"}}],
        },
        {
            "text": "d",
            "tool_calls": [{"name": "write_file", "input": {"path": "d.txt", "content": "D\n"}}],
        },
        {
            "text": "done",
            "tool_calls": [{"name": "finish", "input": {"summary": "all four files"}}],
        },
    ],
}
CHECK = "test -f a.txt && test -f b.txt && test -f sub/c.txt && test -f d.txt"


def can_unshare() -> bool:
    if UNSHARE is None or os.geteuid() != 0:
        return False
    done = subprocess.run(
        [UNSHARE, "-m", "--propagation", "private", "mount", "-t", "tmpfs", "t", "/mnt"],
        capture_output=True,
    )
    return done.returncode == 0


@pytest.fixture
def hosts(tmp_path, s3_url, moto_server):
    if connection.vendor != "postgresql" or not settings.REDIS_URL:
        pytest.skip("machines share only PostgreSQL, Redis and the bucket (the services pass)")
    if not can_unshare():
        pytest.skip("needs root and unshare(1) for mount namespaces")
    procs = Procs(tmp_path)
    folders = {name: tmp_path / name for name in ("h1", "h2", "h3")}
    for folder in folders.values():
        (folder / "workspaces").mkdir(parents=True)

    def argv(name: str, command: list[str]) -> list[str]:
        # Every other machine's folder, and the test's own data folder, under an empty tmpfs.
        hidden = [str(f) for n, f in folders.items() if n != name] + [str(settings.DATA_DIR)]
        mounts = " && ".join(f"mount -t tmpfs hidden {h}" for h in hidden)
        return [
            UNSHARE,
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'{mounts} && exec "$@"',
            "sh",
            *command,
        ]

    def env(name: str, **extra) -> dict[str, str]:
        e = procs.env(
            SHIFTLOG_DATA_DIR=folders[name],
            SHIFTLOG_WORKSPACES=folders[name] / "workspaces",
            SHIFTLOG_BLOBS=folders[name] / "blobs",
            SHIFTLOG_BLOB_STORE=s3_url,
            SHIFTLOG_HOST=name,
            SECRET_KEY="three-hosts-secret-key-from-the-environment-0123456789",
            SHIFTLOG_LEASE_SECONDS=3,
            SHIFTLOG_ALLOW_UNISOLATED="1",
            **moto_server.env(),
            **extra,
        )
        return e

    def manage(name: str, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(
            argv(name, [sys.executable, "manage.py", *args]),
            cwd=BASE_DIR,
            env=env(name),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise AssertionError(
                f"{name}: manage.py {args} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done.stdout

    def worker(name: str):
        command = [
            sys.executable,
            "manage.py",
            "run_huey",
            "-w",
            "1",
            "-k",
            "thread",
            "--no-periodic",
        ]
        return procs.spawn(name, argv(name, command), env(name))

    try:
        yield folders, manage, worker, procs
    finally:
        procs.close()


def test_a_run_killed_on_one_machine_is_finished_on_another_from_the_bucket(hosts, tmp_path):
    folders, manage, worker, procs = hosts
    # Contents of this test's own: the tests share a blob folder, and identical files would
    # have identical blobs there, which the last check would take for ours.
    token = uuid.uuid4().hex
    script = json.loads(json.dumps(SCRIPT).replace("\\n", f" {token}\\n"))
    (folders["h3"] / "script.json").write_text(json.dumps(script))
    # The machines really cannot see one another's folders.
    (folders["h1"] / "workspaces" / "mine.txt").write_text("h1 only")
    seen = manage("h3", "shell", "-c", f"import os; print(os.listdir({str(folders['h1'])!r}))")
    assert seen.strip().splitlines()[-1] == "[]"

    out = manage(
        "h3",
        "create_run",
        "--goal",
        "four files",
        "--check",
        CHECK,
        "--script",
        str(folders["h3"] / "script.json"),
    )
    run_id = int(out.strip().splitlines()[-1])
    a = worker("h1")
    wait_for(
        lambda: any(
            "sleep 60" in (p.get("input") or {}).get("command", "")
            for p in Event.objects.filter(run_id=run_id, kind="tool.call").values_list(
                "payload", flat=True
            )
        ),
        timeout=90,
        what="worker h1 to start the slow command",
        details=lambda: dump_events(run_id) + procs.logs(),
    )
    committed = Run.objects.get(pk=run_id).workspace_tree
    procs.kill_hard(a)
    b = worker("h2")
    procs.reap_until_requeued(run_id, timeout=60)
    run = wait_for(
        lambda: Run.objects.filter(
            pk=run_id, status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED]
        ).first(),
        timeout=120,
        what="the run to end on h2",
        details=lambda: dump_events(run_id) + procs.logs(),
    )
    assert run.status == RunStatus.SUCCEEDED, dump_events(run_id)
    # h1 started from the empty workspace h3's CLI had stored; h2 from what h1 committed.
    first, restored = [
        e.payload for e in Event.objects.filter(run_id=run_id, kind="workspace.restored")
    ]
    assert first["host"] == "h1" and first["files"] == 0
    assert restored["host"] == "h2" and restored["tree"] == committed
    assert restored["files"] == 3 and restored["had"] == "nothing"
    # Every committed write is on h2; the half-done command's file was never committed.
    h2 = folders["h2"] / "workspaces" / f"run-{run_id}"
    assert {p.relative_to(h2).as_posix() for p in h2.rglob("*") if p.is_file()} == {
        "a.txt",
        "b.txt",
        "sub/c.txt",
        "d.txt",
    }
    interrupted = [
        e.payload
        for e in Event.objects.filter(run_id=run_id, kind="tool.result")
        if e.payload.get("data", {}).get("interrupted")
    ]
    assert len(interrupted) == 1
    b.signal(9)

    # The third machine's CLI: diffs and artifacts from the bucket, with no workspace there.
    diff = manage("h3", "diff_checkpoints", str(run_id), "1", "live")
    for path in ("a.txt", "b.txt", "sub/c.txt", "d.txt"):
        assert path in diff
    saved = json.loads(manage("h3", "artifacts", str(run_id), "--json"))
    artifact = next(a for a in saved if a["name"] == "notes-b")
    assert manage("h3", "get_artifact", str(artifact["id"])) == f"B {token}\n"
    # h3 made the run's empty workspace and never held the work: the diffs came from the bucket.
    assert not any((folders["h3"] / "workspaces" / f"run-{run_id}").rglob("*"))
    # No blob in any local folder: the bucket holds them all.
    for folder in folders.values():
        assert not (folder / "blobs").exists() or not any((folder / "blobs").rglob("*"))
    assert not Path(settings.SHIFTLOG["BLOB_ROOT"]).joinpath(committed[:2], committed[2:]).exists()
