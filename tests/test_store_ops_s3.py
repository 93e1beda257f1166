"""Operations on an S3 blob store (moto's server, tests/s3.py): verify_store, prune_store,
/readyz and backup, with SHIFTLOG["BLOB_STORE"] naming a bucket."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from agents import blobstore
from agents.backup import BackupError, backup
from agents.models import Checkpoint, Run
from agents.snapshots import Snapshots
from tests import s3 as moto
from tests.helpers import make_run

pytestmark = pytest.mark.django_db


def cli(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.fixture
def s3_store(settings, s3_url: str):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "BLOB_STORE": s3_url}
    return blobstore.configured()


def test_verify_and_prune_store_on_s3(db, s3_store, tmp_path: Path):
    # The run's protected originals go to the configured store; its trees are made here on S3
    # (workspaces.py, which writes a run's checkpoints, is not switched over in this test).
    run = make_run(goal="s3 ops")
    snaps = Snapshots(s3_store)
    ws = run.workspace_path
    (ws / "notes.txt").write_text("first\n")
    first = snaps.snapshot(ws).tree
    (ws / "notes.txt").write_text("second, only in the run's workspace tree\n")
    latest = snaps.snapshot(ws).tree
    Checkpoint.objects.create(run=run, number=99, seq=0, kind="manual", tree=first)
    Run.objects.filter(pk=run.pk).update(workspace_tree=latest)
    stray = s3_store.put(b"no row names this blob")

    assert "store OK" in cli("verify_store")
    assert "would delete 1 blob(s)" in cli("prune_store", "--grace-seconds", "0", "--dry-run")
    out = cli("prune_store", "--grace-seconds", "0")
    assert out.startswith("deleted 1 blob(s)") and s3_store.describe() in out
    assert not s3_store.exists(stray)
    assert snaps.read(latest, "notes.txt").startswith(b"second")  # the workspace tree is kept
    assert "store OK" in cli("verify_store")

    digest = snaps.files(latest)["notes.txt"].hash
    moto.client().put_object(Bucket=s3_store.bucket, Key=s3_store.key(digest), Body=b"bad")
    err = StringIO()
    with pytest.raises(CommandError, match=r"1 problem\(s\)"):
        call_command("verify_store", stdout=StringIO(), stderr=err)
    assert f"corrupt blob {digest}" in err.getvalue()


def test_store_commands_say_when_the_store_is_unreachable(db, settings, s3_env, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{moto.free_port()}")
    settings.SHIFTLOG = {**settings.SHIFTLOG, "BLOB_STORE": "s3://anywhere/blobs"}
    for command in ("verify_store", "prune_store"):
        with pytest.raises(CommandError, match=r"^blob store unreachable: http://127\.0\.0\.1:"):
            call_command(command, stdout=StringIO(), stderr=StringIO())


def test_readyz_checks_the_s3_store(client, settings, s3_store):
    client.force_login(get_user_model().objects.create_user("ops", is_staff=True))
    response = client.get("/readyz")
    assert response.status_code == 200 and response.json()["store"] == "ok"
    settings.SHIFTLOG = {**settings.SHIFTLOG, "BLOB_STORE": "s3://no-such-bucket-at-all/blobs"}
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["ready"] is False
    assert body["store"].startswith("error: blob store unreachable: ")


def test_readyz_checks_the_folder_store_is_writable(client, settings, tmp_path: Path):
    client.force_login(get_user_model().objects.create_user("ops", is_staff=True))
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    settings.SHIFTLOG = {**settings.SHIFTLOG, "BLOB_STORE": str(not_a_folder)}
    response = client.get("/readyz")
    assert response.status_code == 503 and "blob store unreachable" in response.json()["store"]


def test_backup_refuses_an_s3_store(db, s3_store, tmp_path: Path):
    with pytest.raises(BackupError, match="with an S3 store back up the bucket with its own tools"):
        backup(tmp_path / "backup.tar")
    assert not list(tmp_path.iterdir())
