"""`pip install shiftlog` without a checkout: the wheel built from this repository, installed bare
(no extras) into a fresh virtualenv outside the checkout, runs the embedded product; a setting that
needs an extra says which."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.test_operators import Browser, free_port, stop, wait_serving

BASE_DIR = Path(__file__).resolve().parent.parent

# What the embedded install no longer pulls in (each an extra now).
NOT_IN_THE_BARE_INSTALL = [
    "boto3",
    "botocore",
    "psycopg",
    "psycopg-binary",
    "redis",
    "channels-redis",
    "opentelemetry-exporter-otlp-proto-http",
    "anthropic",
]


def bare_env(home: Path) -> dict[str, str]:
    """A user's environment: nothing of the checkout's or the tests' settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SHIFTLOG_", "DJANGO_", "PYTHON", "VIRTUAL_ENV", "ANTHROPIC_"))
        and k not in ("DATABASE_URL", "REDIS_URL", "OTEL_EXPORTER_OTLP_ENDPOINT")
    }
    env["HOME"] = str(home)
    return env


@pytest.fixture(scope="module")
def installed():
    """The wheel, installed without extras into a virtualenv in a folder outside the checkout."""
    where = Path(tempfile.mkdtemp(prefix="shiftlog-pkg-", dir="/var/tmp"))
    try:
        home = where / "home"
        home.mkdir()
        env = bare_env(home)
        wheels = where / "dist"
        # The sdist, then the wheel built from it (so the sdist carries what the wheel needs).
        built = subprocess.run(
            [sys.executable, "-m", "build", "--no-isolation", "-o", str(wheels), "."],
            cwd=BASE_DIR,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
        assert list(wheels.glob("shiftlog-*.tar.gz"))
        (wheel,) = wheels.glob("shiftlog-*.whl")
        subprocess.run([sys.executable, "-m", "venv", str(where / "venv")], check=True, timeout=120)
        pip = subprocess.run(
            [
                str(where / "venv/bin/python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--no-compile",
                str(wheel),
            ],
            cwd=where,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert pip.returncode == 0, pip.stderr
        yield where, env, wheel
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.no_services
@pytest.mark.timeout(900)
def test_the_wheel_carries_templates_and_static_files_and_no_extras(installed):
    import zipfile

    where, env, wheel = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert "dashboard/assets/templates/registration/login.html" in names
    assert "dashboard/assets/static/shiftlog/shiftlog.css" in names
    assert not any(n.startswith(("tests/", "bench/")) for n in names)
    listed = subprocess.run(
        [str(where / "venv/bin/python"), "-m", "pip", "list", "--format=freeze"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.lower()
    present = {line.split("==")[0].replace("_", "-") for line in listed.splitlines()}
    assert not present & set(NOT_IN_THE_BARE_INSTALL), present & set(NOT_IN_THE_BARE_INSTALL)
    version = subprocess.run(
        [str(where / "venv/bin/shiftlog"), "--version"], env=env, capture_output=True, text=True
    )
    assert version.returncode == 0 and re.fullmatch(r"shiftlog \d+\.\d+\.\d+\s*", version.stdout)


@pytest.mark.slow
@pytest.mark.no_services
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("name", "value", "extra"),
    [
        ("DATABASE_URL", "postgres://u:p@127.0.0.1:1/shiftlog", "postgres"),
        ("REDIS_URL", "redis://127.0.0.1:1/0", "redis"),
        ("SHIFTLOG_BLOB_STORE", "s3://bucket/prefix", "s3"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318", "otel"),
        ("ANTHROPIC_API_KEY", "sk-test", "claude"),
    ],
)
def test_a_setting_without_its_extra_stops_start_up_naming_the_extra(installed, name, value, extra):
    where, env, _ = installed
    out = subprocess.run(
        [str(where / "venv/bin/shiftlog"), "manage", "check"],
        cwd=where,
        env={**env, name: value, "SHIFTLOG_DATA_DIR": str(where / "data-extras")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert f"needs the {extra} extra" in out.stderr and f"shiftlog[{extra}]" in out.stderr, (
        out.stderr[-2000:]
    )


@pytest.mark.slow
@pytest.mark.no_services
@pytest.mark.timeout(900)
def test_shiftlog_run_from_the_wheel_reaches_the_demos_approval(installed):
    where, env, _ = installed
    port = free_port()
    data = where / "data"
    log = where / "run.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(where / "venv/bin/shiftlog"), "run", "--port", str(port), "--data-dir", str(data)],
            cwd=where,
            env={**env, "SHIFTLOG_ALLOW_UNISOLATED": "1"} if not shutil.which("bwrap") else env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_serving(base, proc, log, timeout=120)
        text = log.read_text()
        link = re.search(r"One-time login link for admin: (\S+)", text).group(1)
        assert link.startswith(base + "/login/"), text
        assert "shiftlog manage approvals" in text  # how this install names its commands
        browser = Browser()
        browser.log_in(link)
        deadline = time.monotonic() + 90
        while True:
            status, _, page = browser.open(base + "/approvals/")
            assert status == 200
            if re.search(r"/approvals/\d+/decide", page):
                break
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        # Its stylesheet by a hashed name, cached for good.
        css = re.search(r'href="(/static/shiftlog/shiftlog\.[0-9a-f]{12}\.css)"', page)
        assert css, page[:2000]
        status, headers, _ = browser.open(base + css.group(1))
        assert status == 200 and "immutable" in headers["Cache-Control"]
        assert (data / "db.sqlite3").exists() and (data / "static" / "staticfiles.json").exists()
    finally:
        stop(proc)
    assert proc.returncode == 0, log.read_text()[-3000:]  # stopped by Ctrl-C (SIGINT), cleanly
