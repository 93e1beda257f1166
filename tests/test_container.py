"""The container image and compose.yaml, for real: the image built from the Dockerfile, the
stack brought up with `docker compose up` (web, worker, PostgreSQL, Redis and an S3 server), a
person logging in with a link made in the web container, a scripted run that succeeds on the worker
container (its command inside bubblewrap), its artifact in S3, then `down -v`, always.

No image registry is reachable here, so the base is Debian made with debootstrap
(deploy/debian-base.sh) and PostgreSQL, Redis and moto's S3 server (for MinIO) come from
deploy/compose.local.yaml. Every image is built only when its tag is missing: the tags carry a
hash of what goes into them, so a changed source builds anew and an unchanged one costs nothing.

`make test-container` runs it (SHIFTLOG_CONTAINER_TEST=1; it installs docker.io, docker-compose and
debootstrap with apt-get when missing); `make test` runs it only when every image is there already
(the first build takes minutes: docs/deploy.md has the figures). Elsewhere it is skipped, saying why.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.test_operators import Browser, free_port

BASE_DIR = Path(__file__).resolve().parent.parent
BASE_IMAGE = os.environ.get("SHIFTLOG_BASE_IMAGE", "shiftlog-base:bookworm")
LOCAL = ("postgres", "redis", "moto")

pytestmark = [pytest.mark.slow, pytest.mark.no_services, pytest.mark.timeout(1800)]

# "1": build what is missing; "if-built" (`make test`): run only when every image is there.
MODE = os.environ.get("SHIFTLOG_CONTAINER_TEST", "")
if MODE not in ("1", "if-built"):
    pytest.skip(
        "the container test runs with `make test-container` (SHIFTLOG_CONTAINER_TEST=1)",
        allow_module_level=True,
    )


def sh(*argv: str, timeout: float = 900, check: bool = True, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and done.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-3000:]}"
            f"\n{done.stderr[-3000:]}"
        )
    return done


def content_tag(*paths: Path, ignore: tuple[str, ...] = ()) -> str:
    """A hash of the files under `paths` git tracks (and of those not yet committed)."""
    listed = sh(
        "git",
        "ls-files",
        "--cached",
        "--others",
        "--exclude-standard",
        "--",
        *map(str, paths),
        cwd=BASE_DIR,
    ).stdout.split()
    digest = hashlib.sha256()
    for name in sorted(listed):
        if name.startswith(ignore) or not (BASE_DIR / name).is_file():
            continue
        digest.update(name.encode() + b"\0" + (BASE_DIR / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def image_exists(tag: str) -> bool:
    return sh("docker", "image", "inspect", tag, check=False, timeout=60).returncode == 0


def compose_command() -> list[str] | None:
    if shutil.which("docker") and sh("docker", "compose", "version", check=False).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


class Daemon:
    """The docker daemon: the one running, else one this test starts (and stops, by its pid)."""

    def __init__(self, folder: Path):
        self.proc: subprocess.Popen | None = None
        self.folder = folder

    def ensure(self) -> str:
        """ "" when a daemon answers; else why not."""
        if not shutil.which("docker"):
            return "docker is not installed"
        if sh("docker", "info", check=False, timeout=60).returncode == 0:
            return ""
        if not shutil.which("dockerd") or os.geteuid() != 0:
            return "no docker daemon answers, and this user cannot start dockerd"
        log = open(self.folder / "dockerd.log", "w")  # noqa: SIM115 (kept open for the daemon)
        self.proc = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return "dockerd exited at once: " + (self.folder / "dockerd.log").read_text()[-500:]
            if sh("docker", "info", check=False, timeout=30).returncode == 0:
                return ""
            time.sleep(1)
        return "dockerd did not answer within 60 s"

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        # The bridge dockerd made stays behind it.
        subprocess.run(["ip", "link", "delete", "docker0"], capture_output=True, check=False)


def build_images(timings: dict[str, float]) -> dict[str, str]:
    """The images the stack needs, each built only when its tag is missing."""
    images = {
        "shiftlog": "shiftlog-test:"
        + content_tag(
            Path("Dockerfile"),
            Path(".dockerignore"),
            Path("pyproject.toml"),
            Path("setup.py"),
            Path("README.md"),
            Path("LICENSE"),
            Path("agents"),
            Path("dashboard"),
            Path("api"),
            Path("shiftlog"),
            Path("templates"),
            Path("static"),
        ),
    }
    local = content_tag(Path("deploy/local"))
    images.update({name: f"shiftlog-local-{name}:{local}" for name in LOCAL})
    missing = [tag for tag in [BASE_IMAGE, *images.values()] if not image_exists(tag)]
    if missing and MODE == "if-built":
        pytest.skip(
            f"not built yet: {', '.join(missing)}; `make test-container` builds them (minutes "
            "the first time: docs/deploy.md), after which `make test` runs this test"
        )
    if not image_exists(BASE_IMAGE):
        if not shutil.which("debootstrap"):
            pytest.skip(f"no {BASE_IMAGE} image and no debootstrap to make one")
        started = time.monotonic()
        sh("sh", str(BASE_DIR / "deploy/debian-base.sh"), BASE_IMAGE, timeout=1200)
        timings["base image (debootstrap + import)"] = time.monotonic() - started
    builds = {}
    for name, tag in images.items():
        if image_exists(tag):
            continue
        if name == "shiftlog":
            argv = ["docker", "build", "-q", "-t", tag, str(BASE_DIR)]
        else:
            folder = BASE_DIR / "deploy/local"
            argv = [
                "docker",
                "build",
                "-q",
                "-t",
                tag,
                "-f",
                str(folder / f"{name}.Dockerfile"),
                str(folder),
            ]
        argv[2:2] = ["--build-arg", f"BASE_IMAGE={BASE_IMAGE}"]
        builds[name] = (
            time.monotonic(),
            subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        )
    for name, (_started, proc) in builds.items():  # side by side: most of it is downloading
        out, _ = proc.communicate(timeout=1800)
        assert proc.returncode == 0, f"building the {name} image failed:\n{out[-4000:]}"
    if "shiftlog" in builds:  # the images of earlier sources: only their space is left
        listed = sh(
            "docker", "image", "ls", "shiftlog-test", "--format", "{{.Repository}}:{{.Tag}}"
        )
        for old in set(listed.stdout.split()) - {images["shiftlog"]}:
            sh("docker", "rmi", old, check=False)
    if builds:
        timings[f"images built side by side ({', '.join(builds)})"] = time.monotonic() - min(
            started for started, _ in builds.values()
        )
    return images


class Stack:
    def __init__(self, compose: list[str], images: dict[str, str], port: int):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.token = secrets.token_hex(16)
        self.project = f"shiftlogtest{os.getpid()}"
        self.compose = [
            *compose,
            "-p",
            self.project,
            "--project-directory",
            str(BASE_DIR),
            "-f",
            str(BASE_DIR / "compose.yaml"),
            "-f",
            str(BASE_DIR / "deploy/compose.local.yaml"),
        ]
        self.env = {
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", "/root"),
            "SHIFTLOG_IMAGE": images["shiftlog"],
            "SHIFTLOG_LOCAL_PREFIX": "unused",
            "SHIFTLOG_BASE_IMAGE": BASE_IMAGE,
            "SHIFTLOG_SECRET_KEY": secrets.token_hex(32),
            "POSTGRES_PASSWORD": secrets.token_hex(16),
            "S3_SECRET_KEY": secrets.token_hex(16),
            "SHIFTLOG_METRICS_TOKEN": self.token,
            "SHIFTLOG_PORT": str(port),
            "SHIFTLOG_BASE_URL": self.url,
        }
        self.images = images

    def run(self, *args: str, timeout: float = 600, check: bool = True):
        return sh(*self.compose, *args, env=self.env, timeout=timeout, check=check)

    def container(self, service: str) -> str:
        return self.run("ps", "-q", service).stdout.strip()

    def exec(self, service: str, *argv: str, stdin: str | None = None) -> str:
        cmd = ["docker", "exec", "-i", self.container(service), *argv]
        return sh(*cmd, input=stdin, timeout=120).stdout

    def logs(self) -> str:
        return self.run("logs", "--no-color", "--tail", "60", check=False).stdout[-12000:]

    def leftovers(self) -> str:
        label = f"label=com.docker.compose.project={self.project}"
        return sh("docker", "ps", "-aq", "--filter", label).stdout.strip()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("container")
    daemon = Daemon(folder)
    timings: dict[str, float] = {}
    try:
        why = daemon.ensure()
        if why:
            pytest.skip(f"the container test needs a docker daemon: {why}")
        compose = compose_command()
        if compose is None:
            pytest.skip("neither `docker compose` nor docker-compose is installed")
        images = build_images(timings)
        stack = Stack(compose, images, free_port())
        # The override names the local images by prefix: point it at the hashed tags.
        for name in LOCAL:
            sh("docker", "tag", images[name], f"{stack.project}-{name}")
        stack.env["SHIFTLOG_LOCAL_PREFIX"] = stack.project
        started = time.monotonic()
        try:
            stack.run("up", "-d", "--no-build", timeout=900)
            wait_ready(stack)
            timings["compose up to /readyz 200"] = time.monotonic() - started
            stack.timings = timings
            yield stack
        except BaseException:
            print(stack.logs())
            raise
        finally:
            started = time.monotonic()
            stack.run("down", "-v", "--remove-orphans", "--timeout", "20", check=False)
            for name in LOCAL:
                sh("docker", "rmi", f"{stack.project}-{name}", check=False)
            timings["compose down -v"] = time.monotonic() - started
            left = stack.leftovers()
            print(
                "container test timings (s): "
                + ", ".join(f"{k} {v:.0f}" for k, v in timings.items())
            )
            assert not left, f"containers left behind: {left}"
    finally:
        daemon.stop()


def readyz(stack: Stack, token: str | None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(stack.url + "/readyz", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        return e.code, json.loads(body) if body.startswith(b"{") else {}


def wait_ready(stack: Stack, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            status, body = readyz(stack, stack.token)
            if status == 200:
                return
            last = (status, body)
        except OSError as e:
            last = e
        time.sleep(2)
    raise AssertionError(f"/readyz did not answer 200 within {timeout} s: {last}")


WAIT_FOR_RUN = """
import time
from agents.models import Run
deadline = time.monotonic() + 180
while time.monotonic() < deadline:
    if Run.objects.get(pk={run_id}).status in ("succeeded", "failed", "cancelled", "paused"):
        break
    time.sleep(0.5)
"""

SCRIPT = {
    "turns": [
        {
            "tool_calls": [
                {
                    "name": "bash",
                    "input": {
                        "command": "echo made-in-the-worker > report.txt; id -u > uid.txt; cat report.txt"
                    },
                }
            ]
        },
        {"tool_calls": [{"name": "save_artifact", "input": {"path": "report.txt"}}]},
        {"tool_calls": [{"name": "finish", "input": {"summary": "report written"}}]},
    ]
}


def test_readyz_needs_the_token_and_reports_every_backend(stack):
    status, _ = readyz(stack, None)
    assert status == 403
    status, _ = readyz(stack, "not-the-token")
    assert status == 403
    status, body = readyz(stack, stack.token)
    assert status == 200, body
    assert {k: body[k] for k in ("database", "queue", "channels", "store")} == dict.fromkeys(
        ("database", "queue", "channels", "store"), "ok"
    )


def test_the_processes_run_as_a_user_not_root(stack):
    for service in ("web", "worker"):
        assert stack.exec(service, "id", "-u").strip() == "10001"


def test_a_person_logs_in_and_a_scripted_run_succeeds_on_the_worker_with_its_artifact_in_s3(
    stack,
):
    started = time.monotonic()
    out = stack.exec("web", "shiftlog", "manage", "bootstrap", "--no-demo")
    link = re.search(r"(https?://\S+)\s*$", out).group(1)
    # The server's own address (SHIFTLOG_BASE_URL in compose.yaml), not the container's.
    assert link.startswith(stack.url + "/login/"), out
    browser = Browser()
    browser.log_in(link)

    run_id = int(
        stack.exec(
            "web",
            "sh",
            "-c",
            "cat > /tmp/script.json && shiftlog manage create_run --goal 'write the report' "
            "--check 'grep -q made-in-the-worker report.txt' --script /tmp/script.json --user admin",
            stdin=json.dumps(SCRIPT),
        )
        .strip()
        .splitlines()[-1]
    )
    # One process waits for the run inside the container (each `docker exec` of a command
    # costs a Django start-up), then prints it as `show_run --json` does.
    stack.exec("web", "shiftlog", "manage", "shell", "-c", WAIT_FOR_RUN.format(run_id=run_id))
    shown = json.loads(stack.exec("web", "shiftlog", "manage", "show_run", str(run_id), "--json"))
    assert shown["status"] == "succeeded", (shown, stack.logs())
    # Its command ran on the worker, inside bubblewrap (the worker's container has what
    # bubblewrap needs: compose.yaml), as the sandbox's own user.
    assert shown["isolation"] == "bwrap", shown
    stack.timings["login + scripted run to succeeded"] = time.monotonic() - started

    status, _, page = browser.open(f"{stack.url}/runs/{run_id}/")
    assert status == 200 and "write the report" in page

    (artifact,) = [
        a
        for a in json.loads(
            stack.exec("web", "shiftlog", "manage", "artifacts", str(run_id), "--json")
        )
        if a["name"] == "report.txt"
    ]
    # The blob is in the S3 bucket (read with boto3 from the web container, not the worker's disk).
    body = stack.exec(
        "web",
        "python3",
        "-c",
        (
            "import boto3, sys; s3 = boto3.client('s3'); h = sys.argv[1].split(':')[-1]; "
            "keys = [o['Key'] for o in s3.list_objects_v2(Bucket='shiftlog')['Contents']]; "
            "(key,) = [k for k in keys if k.replace('/', '').endswith(h)]; "
            "print(s3.get_object(Bucket='shiftlog', Key=key)['Body'].read().decode())"
        ),
        artifact["blob"],
    )
    assert body.strip() == "made-in-the-worker"
    # The worker's disk holds no blob folder: with an S3 store, none is written.
    assert "blobs" not in stack.exec("worker", "ls", "/var/lib/shiftlog").split()


def test_the_image_serves_web_worker_or_both_by_its_command(stack):
    image = stack.images["shiftlog"]
    out = sh("docker", "run", "--rm", "--network", "none", image, "--help").stdout
    for command in ("serve", "web", "worker", "manage"):
        assert command in out
    bad = sh("docker", "run", "--rm", "--network", "none", image, "nonsense", check=False)
    assert bad.returncode != 0 and "invalid choice" in bad.stderr


def test_compose_refuses_to_start_without_its_secrets(stack):
    """No secret is committed: each one unset stops compose, naming it."""
    for name in (
        "SHIFTLOG_SECRET_KEY",
        "POSTGRES_PASSWORD",
        "S3_SECRET_KEY",
        "SHIFTLOG_METRICS_TOKEN",
    ):
        env = {k: v for k, v in stack.env.items() if k != name}
        done = sh(*stack.compose, "config", env=env, check=False, timeout=60)
        assert done.returncode != 0 and f"set {name}" in done.stderr, (name, done.stderr)
    assert sh(*stack.compose, "config", env=stack.env, timeout=60).returncode == 0
