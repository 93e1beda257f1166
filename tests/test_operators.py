"""What operators expect of a service: its own address in every link, JSON logs with ids, hashed
static files, a `make run` that sets up without the test browser and says what it does."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from agents import services
from agents.models import Run, RunStatus, Session
from tests.procs import process_env

BASE_DIR = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """urllib with cookies and no automatic redirects: enough to log in with a one-time link."""

    def __init__(self) -> None:
        self.jar = http.cookiejar.CookieJar()

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args, **kwargs):
                return None

        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), NoRedirect
        )

    def open(self, url: str, data: dict | None = None, headers: dict | None = None):
        body = urllib.parse.urlencode(data).encode() if data is not None else None
        req = urllib.request.Request(url, data=body, headers=headers or {})
        try:
            resp = self.opener.open(req, timeout=20)
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read().decode("utf-8", "replace")
        return resp.status, resp.headers, resp.read().decode("utf-8", "replace")

    def log_in(self, link: str) -> None:
        """GET the one-time link (a page asking for a click), then POST it as the button does."""
        status, _, page = self.open(link)
        assert status == 200, page
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        status, headers, page = self.open(link, {"csrfmiddlewaretoken": token}, {"Referer": link})
        assert status == 302, (status, page[:500])
        assert "/login" not in headers["Location"]


def wait_serving(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            urllib.request.urlopen(url + "/healthz", timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing answered at {url} after {timeout} s:\n{log.read_text()}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


# --- served on another port: its links, its logs ---------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.django_db(transaction=True)
def test_served_on_another_port_every_link_uses_it_and_logs_are_json_with_ids(tmp_path):
    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.create_user("admin", is_staff=True, is_superuser=True)
    run = services.create_demo_run(created_by=admin, turn_delay_seconds=0)  # its task is lost
    port = free_port()
    env = process_env(tmp_path)
    env.pop("SHIFTLOG_BASE_URL")  # served on another port, nobody saying where
    env.update(
        {
            # Its own data folder: serve records its address there.
            "SHIFTLOG_DATA_DIR": str(tmp_path / "data"),
            "SHIFTLOG_LOG_FORMAT": "json",
            "SHIFTLOG_REQUEUE_AFTER_SECONDS": "0.5",
            "SHIFTLOG_REAPER_INTERVAL": "0.5",
        }
    )
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(port), "--host", "127.0.0.1"],
            cwd=BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_serving(base, proc, log)
        # The login page names the command; run beside the server, it prints this server's link.
        browser = Browser()
        status, _, page = browser.open(base + "/accounts/login/")
        assert status == 200 and "manage.py login_link --user NAME" in page
        printed = subprocess.run(
            [sys.executable, "manage.py", "login_link", "--user", "admin"],
            cwd=BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert printed.returncode == 0, printed.stderr
        link = printed.stdout.strip().splitlines()[-1]
        assert link.startswith(base + "/login/"), link
        browser.log_in(link)
        status, _, page = browser.open(base + "/")
        assert status == 200

        # A request's id: the proxy's, on the response and on the log lines written for it.
        status, headers, _ = browser.open(
            base + "/no-such-page/", headers={"X-Request-ID": "rq-42"}
        )
        assert status == 404 and headers["X-Request-ID"] == "rq-42"
        status, headers, _ = browser.open(base + "/no-such-page/", headers={"X-Request-ID": "a b"})
        assert re.fullmatch(r"[0-9a-f]{32}", headers["X-Request-ID"])  # not a token: a new id

        # The worker's lines name the run and its session.
        deadline = time.monotonic() + 60
        while Run.objects.get(pk=run.pk).status != RunStatus.AWAITING_APPROVAL:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        stop(proc)
    lines = json_lines(log.read_text())
    assert lines, log.read_text()
    for line in lines:
        assert {"time", "level", "logger", "message", "run_id", "session", "request_id"} <= set(
            line
        ), line
    refused = [x for x in lines if x["request_id"] == "rq-42"]
    assert refused and refused[0]["logger"] == "django.request", lines
    slices = [x for x in lines if x["run_id"] == run.pk and "slice" in x["message"]]
    session = Session.objects.filter(run=run).order_by("-index").first()
    assert slices and slices[-1]["session"] == session.index, lines
    assert (tmp_path / "data" / "server_url").read_text().strip() == base


@pytest.mark.no_services
def test_serve_names_the_address_it_serves_for_links():
    from agents.management.commands.serve import served_url

    assert served_url("127.0.0.1", 8080) == "http://127.0.0.1:8080"
    assert served_url("0.0.0.0", 9000) == "http://127.0.0.1:9000"
    assert served_url("::", 9000) == "http://[::1]:9000"
    assert served_url("shiftlog.lan", 80) == "http://shiftlog.lan:80"


# --- static files: hashed names, cached for good, a new deploy seen at once ------------------
@pytest.mark.any_db
@pytest.mark.django_db
def test_collected_static_files_have_hashed_names_and_a_new_deploy_is_fetched_at_once(
    tmp_path, settings
):
    import asyncio
    import shutil

    from django.core.management import call_command
    from django.test import AsyncClient

    from shiftlog import settings as production

    src = tmp_path / "src"
    shutil.copytree(production.STATICFILES_DIRS[0], src)
    settings.STATICFILES_DIRS = [src]
    settings.STATIC_ROOT = tmp_path / "collected"
    settings.STORAGES = production.STORAGES
    settings.MIDDLEWARE = production.MIDDLEWARE

    def deploy() -> tuple[str, str, str]:
        """collectstatic, then a fresh server process's view (the middleware scans at start):
        the login page's stylesheet URL, its Cache-Control and its body."""
        call_command("collectstatic", interactive=False, verbosity=0)

        async def fetch():
            client = AsyncClient(headers={"host": "127.0.0.1"})
            page = (await client.get("/accounts/login/")).content.decode()
            url = re.search(r'href="(/static/shiftlog/shiftlog[^"]*\.css)"', page).group(1)
            css = await client.get(url)
            assert css.status_code == 200
            body = b"".join([chunk async for chunk in css.streaming_content]).decode()
            return url, css["Cache-Control"], body

        return asyncio.run(fetch())

    first_url, cache, first_body = deploy()
    assert re.fullmatch(r"/static/shiftlog/shiftlog\.[0-9a-f]{12}\.css", first_url), first_url
    assert "immutable" in cache and "max-age=315360000" in cache
    # The next release changes the stylesheet: pages name the new file, with the new content.
    (src / "shiftlog" / "shiftlog.css").write_text(first_body + "\n/* release 2 */\n")
    second_url, _, second_body = deploy()
    assert second_url != first_url and "release 2" in second_body
    # A page still open from before keeps its old stylesheet until reloaded.
    assert (settings.STATIC_ROOT / first_url.removeprefix("/static/")).exists()


# --- make run ---------------------------------------------------------------------------------
@pytest.mark.no_services
def test_make_run_sets_up_saying_so_without_installing_the_test_browser():
    out = subprocess.run(
        ["make", "-n", "run", "PORT=8123", "HOST=0.0.0.0"],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "chromium" not in out.stdout
    assert "bubblewrap" in out.stdout  # the sandbox is still set up
    assert "manage.py serve --setup --port 8123 --host 0.0.0.0" in out.stdout
    tests = subprocess.run(
        ["make", "-n", "test"], cwd=BASE_DIR, capture_output=True, text=True, timeout=60
    )
    assert "chromium" in tests.stdout  # the tests still get it


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.django_db(transaction=True)
def test_serve_setup_says_each_step_and_prints_a_link_to_the_port_served(tmp_path):
    port = free_port()
    env = process_env(tmp_path)
    env.pop("SHIFTLOG_BASE_URL")
    data = tmp_path / "data"
    env["SHIFTLOG_DATA_DIR"] = str(data)
    env["SHIFTLOG_DB"] = str(data / "db.sqlite3")  # a new database: set-up migrates it
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    env["SHIFTLOG_HUEY_DB"] = str(tmp_path / "huey.sqlite3")
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--setup", "--port", str(port)],
            cwd=BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_serving(base, proc, log, timeout=120)
        text = log.read_text()
        for step in ("Data folder:", "Applying the database's migrations", "Collecting the static"):
            assert step in text, text
        link = re.search(r"One-time login link for admin: (\S+)", text).group(1)
        assert link.startswith(base + "/login/"), link
        browser = Browser()
        browser.log_in(link)
        _, _, page = browser.open(base + "/")
        css = re.search(r'href="(/static/shiftlog/shiftlog\.[0-9a-f]{12}\.css)"', page)
        assert css, page[:2000]
        status, headers, _ = browser.open(base + css.group(1))
        assert status == 200 and "immutable" in headers["Cache-Control"]
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_served_on_another_host_its_pages_answer_and_links_name_it(tmp_path):
    """--host 127.0.0.2 (another loopback address, as a LAN name would be): that host is
    allowed (not a 400 for every page) and the links name it."""
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user("admin", is_staff=True, is_superuser=True)
    port = free_port()
    env = process_env(tmp_path)
    env.pop("SHIFTLOG_BASE_URL")
    env["SHIFTLOG_DATA_DIR"] = str(tmp_path / "data")
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(port), "--host", "127.0.0.2"],
            cwd=BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.2:{port}"
    try:
        wait_serving(base, proc, log)
        printed = subprocess.run(
            [sys.executable, "manage.py", "login_link", "--user", "admin"],
            cwd=BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        link = printed.stdout.strip().splitlines()[-1]
        assert link.startswith(base + "/login/"), printed.stdout + printed.stderr
        browser = Browser()
        browser.log_in(link)
        status, _, _ = browser.open(base + "/")
        assert status == 200
    finally:
        stop(proc)


@pytest.mark.no_services
@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("SHIFTLOG_LOG_FORMAT", "xml", "SHIFTLOG_LOG_FORMAT must be plain or json"),
        ("SHIFTLOG_BASE_URL", "ftp://example.org", "SHIFTLOG_BASE_URL must start with http"),
    ],
)
def test_a_bad_log_format_or_base_url_stops_start_up_naming_it(tmp_path, name, value, says):
    from tests.test_settings import _check

    proc = _check({name: value}, tmp_path)
    assert proc.returncode != 0 and says in proc.stderr, proc.stderr[-2000:]
