"""The filesystem a sandboxed command sees, and the environment it gets, tried from real commands.

Every refusal sits next to a positive control: the thing exists on the host (so the refusal
means something), and the same kind of access to an allowed place works. The data folder and a
fake "other run" live under /var/tmp, not /tmp, because the sandbox's private /tmp would hide
a folder there by accident.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.sandbox import Workspace, isolation_available, run_command, view
from agents.sandbox.view import build_view, toolchain_path
from tests.sandboxing import host_folder, marker, remove_folder

pytestmark = pytest.mark.no_services

BWRAP = isolation_available() == "bwrap"
needs_bwrap = pytest.mark.skipif(not BWRAP, reason="bubblewrap is not usable here")
ISOLATIONS = ["subprocess", pytest.param("bwrap", marks=needs_bwrap)]
REPO = Path(__file__).resolve().parent.parent
IN_VENV = sys.prefix != sys.base_prefix


@dataclass
class Host:
    root: Path
    data: Path
    ws: Workspace
    secret: str  # a string in every hidden file, which must never show up in output


@pytest.fixture
def host() -> Iterator[Host]:
    root = host_folder("shiftlog-view-")
    secret = f"SECRET-{marker()}"
    data = root / "data"
    (data / "blobs" / "ab").mkdir(parents=True)
    (data / "workspaces" / "run-2").mkdir(parents=True)
    for rel in (
        "db.sqlite3",
        "secret_key",
        "huey.sqlite3",
        "blobs/ab/cdef",
        "workspaces/run-2/notes.txt",
    ):
        (data / rel).write_text(f"{secret} {rel}\n")
    try:
        yield Host(root, data, Workspace(data / "workspaces" / "run-1"), secret)
    finally:
        remove_folder(root)


def sandboxed(command: str, ws: Workspace, **kwargs) -> tuple[int | None, str]:
    result = run_command(command, workspace=ws, isolation="bwrap", timeout=30, **kwargs)
    return result.exit_code, result.output


def _first_entry(folder: str, skip: tuple[str, ...] = ()) -> str | None:
    try:
        names = sorted(n for n in os.listdir(folder) if n not in skip)
    except OSError:
        return None
    return os.path.join(folder, names[0]) if names else None


def hidden_paths(host: Host) -> dict[str, str | None]:
    """Host paths that must not exist inside the sandbox (None: this machine has none)."""
    etc_secrets = ["/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssh", "/etc/ssl/private"]
    return {
        "database": str(host.data / "db.sqlite3"),
        "secret key": str(host.data / "secret_key"),
        "queue": str(host.data / "huey.sqlite3"),
        "blob store": str(host.data / "blobs"),
        "blob": str(host.data / "blobs" / "ab" / "cdef"),
        "other run's workspace": str(host.data / "workspaces" / "run-2"),
        "other run's file": str(host.data / "workspaces" / "run-2" / "notes.txt"),
        "project source": str(REPO),
        "project file": str(REPO / "agents" / "sandbox" / "bash.py"),
        "shiftlog venv": sys.prefix if IN_VENV else None,
        "shiftlog venv python": sys.executable if IN_VENV else None,
        "file in /root": _first_entry("/root", skip=(".pyenv",)),
        "/home": _first_entry("/home"),
        "etc secret": next((p for p in etc_secrets if os.path.lexists(p)), None),
        "/var": _first_entry("/var"),
        "/run": _first_entry("/run"),
        "/sys": "/sys/fs",
        "host /proc": f"/proc/{os.getpid()}/environ",
    }


HIDDEN = [
    "database",
    "secret key",
    "queue",
    "blob store",
    "blob",
    "other run's workspace",
    "other run's file",
    "project source",
    "project file",
    "shiftlog venv",
    "shiftlog venv python",
    "file in /root",
    "/home",
    "etc secret",
    "/var",
    "/run",
    "/sys",
    "host /proc",
]


@needs_bwrap
@pytest.mark.parametrize("what", HIDDEN)
def test_hidden_path_cannot_be_read_or_written(host: Host, what: str) -> None:
    path = hidden_paths(host)[what]
    if path is None:
        pytest.skip(f"this machine has no {what}")
    assert os.path.lexists(path), f"the test means nothing: {path} does not exist on the host"
    is_dir = os.path.isdir(path)
    before = sorted(os.listdir(path)) if is_dir else Path(path).read_bytes()

    code, out = sandboxed(
        f"ls -d '{path}'; cat '{path}'; test -e '{path}' && echo VISIBLE", host.ws
    )
    assert "VISIBLE" not in out
    assert host.secret not in out
    assert out.count("No such file or directory") == 2, out  # ENOENT, not "Permission denied"

    target = f"{path}/shiftlog-probe" if is_dir else path
    code, out = sandboxed(f"echo pwned >> '{target}' && echo WROTE", host.ws)
    assert code != 0 and "WROTE" not in out, out
    after = sorted(os.listdir(path)) if is_dir else Path(path).read_bytes()
    assert after == before

    # Positive control: the same read and write in the workspace work.
    code, out = sandboxed("echo kept >> mine.txt && cat mine.txt && ls -d .", host.ws)
    assert code == 0 and out == "kept\n.\n", out


@needs_bwrap
def test_what_a_command_may_use(host: Host) -> None:
    (host.ws.path / "from-host.txt").write_text("hello from the host\n")
    script = "; ".join(
        [
            "cat from-host.txt",
            "echo made-inside > made.txt",
            "echo tmp > /tmp/t && cat /tmp/t",
            "echo home > $HOME/h && cat $HOME/h && echo $HOME",
            "test -r /usr/bin/env && echo usr-readable",
            "touch /usr/shiftlog-probe 2>&1 | grep -o 'Read-only file system'",
            "id -un; id -u",
            "grep -c '^agent:' /etc/passwd",
            "grep CapEff /proc/self/status",
            "ls /proc | grep -c '^[0-9]'",  # sh, ls, grep and bwrap's init: a handful
            "python3 -c 'import sys; print(sys.prefix)'",
            "awk 'BEGIN { print \"awk works\" }'",
        ]
    )
    code, out = sandboxed(script, host.ws)
    lines = out.splitlines()
    assert code == 0, out
    assert lines[:6] == [
        "hello from the host",
        "tmp",
        "home",
        "/home/agent",
        "usr-readable",
        "Read-only file system",
    ], out
    assert lines[6:9] == ["agent", "1000", "1"], out
    assert lines[9].split() == ["CapEff:", "0000000000000000"], out
    assert int(lines[10]) <= 6, out
    assert lines[11] == sys.base_prefix, out
    assert lines[12] == "awk works"
    assert (host.ws.path / "made.txt").read_text() == "made-inside\n"
    # /tmp and HOME are private and start empty at every command.
    code, out = sandboxed("ls -A /tmp $HOME", host.ws)
    assert code == 0 and out.split() == ["/home/agent:", "/tmp:"], out


@needs_bwrap
def test_etc_is_an_allow_list(host: Host) -> None:
    visible = [
        p for p in ("/etc/hosts", "/etc/nsswitch.conf", "/etc/ld.so.cache") if os.path.exists(p)
    ]
    code, out = sandboxed("ls -A /etc", host.ws)
    assert code == 0, out
    inside = set(out.split())
    assert {os.path.basename(p) for p in visible} <= inside  # positive control
    assert {"passwd", "group"} <= inside
    for secret in ("shadow", "gshadow", "sudoers", "ssh", "pip.conf", "npmrc", "environment"):
        assert secret not in inside
    if os.path.isdir("/etc/ssl/certs"):
        code, out = sandboxed("ls /etc/ssl; ls /etc/ssl/certs | head -1", host.ws)
        assert out.split()[0] == "certs" and "private" not in out, out


@needs_bwrap
def test_the_hidden_data_folder_is_hidden_through_its_parents_too(host: Host) -> None:
    # The workspace's parent folders exist (the mount needs them) but show nothing else.
    code, out = sandboxed(f"ls -A {host.data} {host.data}/workspaces {host.root}", host.ws)
    assert code == 0, out
    assert sorted(out.split()) == sorted(
        [
            f"{host.data}:",
            "workspaces",
            f"{host.data}/workspaces:",
            "run-1",
            f"{host.root}:",
            "data",
        ]
    ), out
    # Nor can a command add files beside the workspace: the root of the view is read-only.
    code, out = sandboxed(f"touch {host.data}/new-file", host.ws)
    assert code != 0 and "Read-only file system" in out
    assert not (host.data / "new-file").exists()


@needs_bwrap
def test_host_processes_are_invisible(host: Host) -> None:
    code, out = sandboxed("ls /proc/1/exe -l; cat /proc/1/cmdline | tr '\\0' ' '; echo", host.ws)
    # pid 1 is bwrap's own init, not the host's; the test process is not there at all.
    assert "bwrap" in out, out
    code, out = sandboxed(f"cat /proc/{os.getpid()}/cmdline", host.ws)
    assert code != 0 and "No such file or directory" in out
    assert Path(f"/proc/{os.getpid()}/cmdline").exists()  # it is there on the host


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_path_and_python_are_not_shiftlogs_venv(host: Host, isolation: str) -> None:
    result = run_command(
        "echo $PATH; command -v python3; python3 -c 'import sys; print(sys.prefix)'",
        workspace=host.ws,
        isolation=isolation,
    )
    assert result.exit_code == 0, result.output
    path, python3, prefix = result.output.split()
    assert path.endswith(":/usr/local/bin:/usr/bin:/bin")
    assert path.split(":")[0] == os.path.join(sys.base_prefix, "bin") or sys.base_prefix == "/usr"
    if IN_VENV:
        assert sys.prefix not in path
        assert not python3.startswith(sys.prefix)
        assert prefix != sys.prefix
    assert prefix == sys.base_prefix


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_toolchain_folder_is_visible_and_first_on_path(host: Host, isolation: str) -> None:
    tools = host.root / "toolchain"
    (tools / "bin").mkdir(parents=True)
    (tools / "bin" / "hello-tool").write_text("#!/bin/sh\necho hello from the toolchain\n")
    (tools / "bin" / "hello-tool").chmod(0o755)
    venv = host.root / "venv"
    subprocess.run(
        [os.path.join(sys.base_prefix, "bin", "python3"), "-m", "venv", "--without-pip", str(venv)],
        check=True,
    )
    result = run_command(
        "hello-tool && python -c 'import sys; print(sys.prefix)'",
        workspace=host.ws,
        isolation=isolation,
        toolchain=[str(tools), str(venv)],
    )
    assert result.exit_code == 0, result.output
    assert result.output == f"hello from the toolchain\n{venv}\n"
    # Not listed: not there (bwrap) and not on PATH.
    result = run_command("hello-tool", workspace=host.ws, isolation=isolation)
    assert result.exit_code == 127, result.output
    assert toolchain_path([str(tools)]).startswith(f"{tools}/bin:")


def test_build_view_never_binds_the_host_root(host: Host) -> None:
    argv = build_view(host.ws.path)
    pairs = list(zip(argv, argv[1:], argv[2:], strict=False))
    assert ("--ro-bind", "/", "/") not in pairs and ("--bind", "/", "/") not in pairs
    binds = {b for flag, _src, b in pairs if flag in ("--bind", "--ro-bind")}
    assert str(host.ws.path) in binds
    assert not {str(host.data), "/etc", "/root", "/home", "/var"} & binds
    assert ("--bind", str(host.ws.path), str(host.ws.path)) in pairs
    # Every view ends with its parent: the fork server starts bwrap with posix_spawn, no
    # PR_SET_PDEATHSIG of its own, relying on this (bash.run_command, dies_with_server).
    assert "--die-with-parent" in argv
    # With the copy of /etc's allowed entries (what commands get), /etc is that copy, never
    # the host's /etc.
    folder = view.etc_copy()
    if folder is not None:
        argv = build_view(host.ws.path, etc_folder=folder)
        pairs = list(zip(argv, argv[1:], argv[2:], strict=False))
        assert ("--ro-bind", folder, "/etc") in pairs
        assert not [p for p in pairs if p[0] in ("--bind", "--ro-bind") and p[1] == "/etc"]


# --- /etc in one mount: a copy of the allowed entries --------------------------------------------
@pytest.fixture
def fake_etc(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """A host /etc of the test's own, and a base folder for its copies."""
    root = host_folder("shiftlog-etc-")
    etc, base = root / "etc", root / "copies"
    (etc / "ssl" / "certs").mkdir(parents=True)
    (etc / "ssl" / "private").mkdir()
    (etc / "ssl" / "private" / "key.pem").write_text("PRIVATE\n")
    (etc / "ssl" / "certs" / "ca.pem").write_text("CA\n")
    (etc / "ssl" / "certs" / "link.pem").symlink_to("/usr/share/ca-certificates/x.crt")
    (etc / "hosts").write_text("127.0.0.1 localhost\n")
    (etc / "shadow").write_text("root:SECRET\n")
    (root / "zone").write_text("UTC-zone\n")
    (etc / "localtime").symlink_to(root / "zone")
    (etc / "dangling").symlink_to(root / "nowhere")
    monkeypatch.setattr(view, "_ETC_ROOT", str(etc))
    monkeypatch.setattr(view, "_etc_base", lambda: base)
    monkeypatch.setattr(view, "_ETC", view._EtcCopy())
    try:
        yield etc, base
    finally:
        remove_folder(root)


ALLOWED = ("hosts", "localtime", "ssl/certs", "dangling", "missing")


def test_the_etc_copy_holds_the_allowed_entries_and_nothing_else(
    fake_etc: tuple[Path, Path],
) -> None:
    _etc, base = fake_etc
    folder = Path(view.etc_copy(ALLOWED) or "")
    assert folder.parent == base and oct(base.stat().st_mode & 0o777) == "0o700"
    found = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    assert found == sorted(
        [
            "group",
            "hosts",
            "localtime",
            "passwd",
            "ssl",
            "ssl/certs",
            "ssl/certs/ca.pem",
            "ssl/certs/link.pem",
        ]
    )
    assert (folder / "hosts").read_text() == "127.0.0.1 localhost\n"
    # A top-level link is copied as what it points to (as a bind shows it); a link inside a
    # folder stays a link (as under a bind).
    assert not (folder / "localtime").is_symlink()
    assert (folder / "localtime").read_text() == "UTC-zone\n"
    assert os.readlink(folder / "ssl/certs/link.pem") == "/usr/share/ca-certificates/x.crt"
    # Asked again within the recheck time: the same copy, not made again.
    assert view.etc_copy(ALLOWED) == str(folder)


def test_a_change_in_etc_makes_a_new_copy(
    fake_etc: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    etc, _base = fake_etc
    first = view.etc_copy(ALLOWED)
    (etc / "hosts").write_text("127.0.0.1 localhost\n10.0.0.1 db\n")
    assert view.etc_copy(ALLOWED) == first  # not looked at again yet
    monkeypatch.setattr(view, "ETC_RECHECK_S", 0.0)
    second = view.etc_copy(ALLOWED)
    assert second != first
    assert Path(second or "", "hosts").read_text().endswith("10.0.0.1 db\n")
    (etc / "ssl" / "certs" / "new.pem").write_text("NEW\n")  # deep inside an entry
    third = view.etc_copy(ALLOWED)
    assert third not in (first, second) and Path(third or "", "ssl/certs/new.pem").exists()


def test_a_base_folder_others_may_write_gives_no_copy(
    fake_etc: tuple[Path, Path],
) -> None:
    _etc, base = fake_etc
    base.mkdir(mode=0o777)
    os.chmod(base, 0o777)
    assert view.etc_copy(ALLOWED) is None  # the entries are bound one by one instead
    assert not list(base.iterdir())


@needs_bwrap
def test_commands_see_the_copy_as_etc_read_only(host: Host) -> None:
    folder = view.etc_copy()
    if folder is None:
        pytest.skip("no copy of /etc here")
    _code, out = sandboxed(
        "cat /etc/hosts; grep -c '^agent:' /etc/passwd; touch /etc/x 2>&1; "
        "echo y >> /etc/hosts 2>&1",
        host.ws,
    )
    assert out.startswith(Path("/etc/hosts").read_text()), out
    assert out.count("Read-only file system") == 2, out
    assert "\n1\n" in out, out
    assert not Path(folder, "x").exists()
    assert Path(folder, "hosts").read_text() == Path("/etc/hosts").read_text()


# --- what a command sees of the environment ----------------------------------------------------
CANARIES = {
    "ANTHROPIC_API_KEY": f"sk-ant-canary-{marker()}",
    "DATABASE_URL": f"postgres://canary-{marker()}@db/x",
    "REDIS_URL": f"redis://canary-{marker()}",
    "SHIFTLOG_METRICS_TOKEN": f"metrics-canary-{marker()}",
    "SECRET_KEY": f"secret-canary-{marker()}",
}
WORKER = """
import json, sys
from agents.sandbox import Workspace, run_command
ws, isolation, command = sys.argv[1:4]
r = run_command(command, workspace=Workspace(ws), isolation=isolation, timeout=60,
                output_limit=10_000_000, extra_env={"PASSED_IN": "visible-value"})
print(json.dumps({"exit_code": r.exit_code, "output": r.output}))
"""
ENV_PROBE = (
    "env; echo '--- self'; tr '\\0' '\\n' < /proc/self/environ; "
    "echo '--- pid 1'; tr '\\0' '\\n' < /proc/1/environ; "
    "echo '--- all'; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; echo '--- end'"
)


def _run_in_a_worker(ws: Workspace, isolation: str) -> dict[str, str]:
    """Run ENV_PROBE from a real worker process whose own environment holds the canaries."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **CANARIES}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, str(ws.path), isolation, ENV_PROBE],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    output = json.loads(done.stdout)["output"]
    chunks = output.split("--- ")
    parts = {"env": chunks[0]}
    for chunk in chunks[1:]:
        name, _, body = chunk.partition("\n")
        parts[name] = body
    assert output.rstrip().endswith("--- end"), output[-500:]
    return parts


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_no_secret_of_the_worker_reaches_a_command(host: Host, isolation: str) -> None:
    parts = _run_in_a_worker(host.ws, isolation)
    # Positive control: what the harness passes on purpose is seen, in env and in /proc.
    assert "PASSED_IN=visible-value" in parts["env"]
    assert "PASSED_IN=visible-value" in parts["self"]
    for where in ("env", "self"):
        for name, value in CANARIES.items():
            assert value not in parts[where], f"{name} leaked into {where}"
    if isolation == "bwrap":
        for where in ("pid 1", "all"):
            for name, value in CANARIES.items():
                assert value not in parts[where], f"{name} leaked through /proc ({where})"
        assert "PASSED_IN=visible-value" in parts["all"]
    else:
        # Without a PID namespace the host's /proc shows the worker's own environment: the grep
        # does find the canaries there (which is why a worker with secrets needs bubblewrap).
        assert any(value in parts["all"] for value in CANARIES.values())


@needs_bwrap
def test_the_suites_own_data_folder_is_outside_tmp_and_hidden() -> None:
    from django.conf import settings

    data = Path(settings.DATA_DIR)
    assert not str(data).startswith("/tmp/"), "a private /tmp would hide it by accident"
    key = data / "secret_key"
    assert key.is_file()  # made by the settings: the positive control
    ws = Workspace(Path(settings.SHIFTLOG["WORKSPACE_ROOT"]) / f"run-view-{marker()}")
    try:
        _, out = sandboxed(f"cat {key}; ls -A {data}", ws)
        assert "No such file or directory" in out
        assert key.read_text().strip() not in out
        assert out.splitlines()[-1] == Path(settings.SHIFTLOG["WORKSPACE_ROOT"]).name, out
    finally:
        remove_folder(ws.path)
