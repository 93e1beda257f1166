"""`manage.py backup` while the product writes, `manage.py restore` into an empty installation."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
from django.db import connection

from agents import services
from agents.models import Event, Run
from tests.helpers import approve_pending, drive_until_idle
from tests.procs import BASE_DIR, Procs

pytestmark = pytest.mark.django_db(transaction=True)

# Opens every run of the installation the way a person would, and reports what it saw.
OPEN_EVERY_RUN = """
import json
from django.contrib.auth import get_user_model
from django.db.models import Count, Max, Min
from django.test import Client
from agents.models import Run, Event
admin = get_user_model().objects.create_superuser("restorer", password="pw-restorer-1")
client = Client()
client.force_login(admin)
seen = {}
for run in Run.objects.order_by("pk"):
    pages = [run.get_absolute_url(), f"/runs/{run.pk}/timeline/"]
    pages += [f"/runs/{run.pk}/diff/?a={c.number}&b=live" for c in run.checkpoints.all()]
    statuses = [client.get(p, HTTP_HOST="localhost").status_code for p in pages]
    agg = Event.objects.filter(run=run).aggregate(n=Count("pk"), lo=Min("seq"), hi=Max("seq"))
    seen[run.pk] = {"statuses": statuses, "events": agg["n"], "first": agg["lo"],
                    "last": agg["hi"], "last_seq": run.last_seq, "status": run.status}
print(json.dumps(seen))
"""


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path)
    yield p
    p.close()


@pytest.fixture
def empty_installation(tmp_path):
    """The environment of a second, empty installation: its own data folder and database."""
    home = tmp_path / "restored"
    home.mkdir()
    env = Procs(tmp_path).env(
        SHIFTLOG_DATA_DIR=home,
        SHIFTLOG_WORKSPACES=home / "workspaces",
        SHIFTLOG_BLOBS=home / "blobs",
        SHIFTLOG_DB=home / "db.sqlite3",
    )
    if connection.vendor != "postgresql":
        yield env
        return
    import psycopg

    name = f"shiftlog_restore_{Path(tmp_path).name[-20:].replace('-', '_')}".lower()
    db = connection.settings_dict
    admin = psycopg.connect(
        host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname="postgres"
    )
    admin.autocommit = True
    admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    admin.execute(f'CREATE DATABASE "{name}"')
    env["DATABASE_URL"] = env["DATABASE_URL"].rsplit("/", 1)[0] + f"/{name}"
    try:
        yield env
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def manage(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_a_backup_taken_while_runs_write_restores_whole_into_an_empty_installation(
    tmp_path, procs, empty_installation, decider
):
    waiting = drive_until_idle(services.create_demo_run())  # three checkpoints, an approval
    finished = drive_until_idle(services.create_demo_run())
    approve_pending(finished, decider)
    finished = drive_until_idle(finished)
    assert finished.status == "succeeded"
    before = {r.pk: r.last_seq for r in Run.objects.all()}

    # A person keeps writing notes to the waiting run while the backup is taken.
    stop = threading.Event()
    notes = []

    def keep_writing():
        try:
            while not stop.is_set():
                services.note_run(waiting.pk, f"note {len(notes)}", actor="user:dana")
                notes.append(1)
        finally:
            connection.close()

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        out = tmp_path / "shiftlog.backup"
        said = procs.manage("backup", "--out", str(out), timeout=120)
    finally:
        stop.set()
        writer.join()
    assert notes, "the writer wrote nothing while the backup ran"
    assert "backup written to" in said and "2 run(s)" in said
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]

    done = manage(empty_installation, "restore", str(out))
    assert done.returncode == 0, done.stderr
    assert "restored" in done.stdout and "store OK" in done.stdout, done.stdout
    opened = manage(empty_installation, "shell", "-c", OPEN_EVERY_RUN)
    assert opened.returncode == 0, opened.stderr
    seen = {int(k): v for k, v in json.loads(opened.stdout.strip().splitlines()[-1]).items()}
    assert set(seen) == set(before)
    for pk, s in seen.items():
        assert all(code == 200 for code in s["statuses"]), (pk, s)
        # A consistent snapshot: the log is contiguous and the run's counter agrees with it.
        assert s["first"] == 1 and s["last"] == s["events"] == s["last_seq"], (pk, s)
        assert s["last_seq"] >= before[pk]
    assert seen[finished.pk]["status"] == "succeeded"
    assert seen[waiting.pk]["status"] == "awaiting_approval"

    # The restored installation is no longer empty: a second restore is refused, nothing changed.
    again = manage(empty_installation, "restore", str(out))
    assert again.returncode == 2
    assert "already has runs: restore into an empty one" in again.stderr


def test_restore_refuses_what_is_not_a_good_backup(tmp_path, procs, empty_installation):
    drive_until_idle(services.create_demo_run())
    out = tmp_path / "good.backup"
    procs.manage("backup", "--out", str(out), "--no-workspaces")

    not_a_tar = tmp_path / "notes.txt"
    not_a_tar.write_text("hello")
    done = manage(empty_installation, "restore", str(not_a_tar))
    assert done.returncode == 2 and "is not a Shiftlog backup" in done.stderr

    missing = manage(empty_installation, "restore", str(tmp_path / "nope.backup"))
    assert missing.returncode == 2 and "no backup file" in missing.stderr

    # One blob's bytes changed: the restore names it. (The tests share one store, so the backup may
    # list blobs other tests damaged on purpose; restore leaves those out, so one of them won't do.)
    damaged = tmp_path / "damaged.backup"
    with tarfile.open(out) as src, tarfile.open(damaged, "w") as dst:
        left_out = set(json.loads(src.extractfile("manifest.json").read())["damaged_blobs"])
        hit = None
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isreg() else None
            if (
                data is not None
                and m.name.startswith("blobs/")
                and m.name[len("blobs/") :].replace("/", "") not in left_out
                and hit is None
            ):
                hit, data = m.name, data + b"tampered"
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    assert hit is not None, "the backup holds no blob it does not already mark damaged"
    done = manage(empty_installation, "restore", str(damaged))
    assert done.returncode == 2
    assert f"blob {hit[len('blobs/') :].replace('/', '')} in the backup is damaged" in done.stderr

    # A backup of the other kind of database is refused before anything is touched.
    other = tmp_path / "other.backup"
    with tarfile.open(out) as src, tarfile.open(other, "w") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isreg() else None
            if m.name == "manifest.json":
                manifest = json.loads(data)
                manifest["vendor"] = "sqlite" if connection.vendor == "postgresql" else "postgresql"
                data = json.dumps(manifest).encode()
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    done = manage(empty_installation, "restore", str(other))
    assert (
        done.returncode == 2 and "restore it where the same database is configured" in done.stderr
    )


def test_backup_errors_are_clear_and_leave_no_file(tmp_path, procs):
    Run.objects.all().delete()
    done = manage(procs.env(), "backup", "--out", str(tmp_path / "no" / "such" / "f.backup"))
    assert done.returncode == 2 and "no folder" in done.stderr
    done = manage(procs.env(), "backup", "--out", str(tmp_path))
    assert done.returncode == 2 and "is a folder" in done.stderr
    done = manage(procs.env(), "backup")
    assert done.returncode == 2 and "--out" in done.stderr
    assert Event.objects.count() == 0


def test_a_damaged_blob_in_the_store_is_marked_in_the_backup_and_left_out_of_the_restore(
    tmp_path, procs, empty_installation
):
    """Found by `make test`: a blob another test had damaged was copied as it was, and the restore
    then refused the whole backup. Each blob is now checked as it is copied."""
    from agents.blobstore import BlobStore

    drive_until_idle(services.create_demo_run())
    store = BlobStore()
    orphan = store.put(b"nobody names this blob")
    store.path(orphan).chmod(0o644)
    store.path(orphan).write_bytes(b"changed behind the store's back")
    out = tmp_path / "with-damage.backup"
    procs.manage("backup", "--out", str(out), "--no-workspaces")
    with tarfile.open(out) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
    # (The tests share one store: blobs other tests damaged on purpose are listed too.)
    assert orphan in manifest["damaged_blobs"]

    done = manage(empty_installation, "restore", str(out))
    assert done.returncode == 0, done.stderr
    assert "store OK" in done.stdout  # the blobs the runs need are all there
    assert f"blob {orphan} was damaged in the store it was backed up from: left out" in done.stderr
    restored = Path(empty_installation["SHIFTLOG_BLOBS"])
    assert not (restored / orphan[:2] / orphan[2:]).exists()
    store.delete(orphan)
