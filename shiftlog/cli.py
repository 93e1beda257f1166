"""The `shiftlog` command of the installed package (pyproject.toml [project.scripts]).

    shiftlog run [--port 8000] [--host 127.0.0.1] [--data-dir DIR] [--no-demo]
        the embedded product, as `make run` in a checkout: sets up its data folder (saying each
        step), prints a one-time login link and serves web, worker and reaper together
    shiftlog serve [--port] [--host] [--workers]   the same processes, without the set-up
    shiftlog web [--port] [--host]                 daphne alone (workers run apart: the container)
    shiftlog worker [--workers N]                  one huey consumer (thread workers)
    shiftlog manage COMMAND …                      any management command (`manage.py` of a checkout)
    shiftlog --version

The data folder is SHIFTLOG_DATA_DIR, or --data-dir, or the user's data folder
(~/.local/share/shiftlog); every other setting is the environment, as in docs/deploy.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    try:
        return version("shiftlog")
    except PackageNotFoundError:  # a checkout that was never installed
        return "unknown"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shiftlog",
        description="Shiftlog, a control plane for long-running AI agents.",
        epilog="shiftlog manage help lists every management command.",
    )
    p.add_argument("--version", action="version", version=f"shiftlog {package_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def served(name: str, help: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help, description=help)
        cmd.add_argument("--port", type=int, default=8000, help="default: 8000")
        cmd.add_argument("--host", default="127.0.0.1", help="address to listen on")
        cmd.add_argument("--data-dir", help="the data folder (default: SHIFTLOG_DATA_DIR)")
        return cmd

    run = served("run", "set up the data folder and serve the embedded product")
    run.add_argument("--no-demo", action="store_true", help="no demo run on a new database")
    serve = served("serve", "serve web, worker and reaper (no set-up)")
    serve.add_argument("--workers", type=int, help="huey threads; 0: web only")
    served("web", "serve the web alone: pages, API, WebSockets (workers run apart)")
    worker = sub.add_parser("worker", help="run a huey consumer (the queue the settings name)")
    worker.add_argument("--workers", type=int, default=4, help="threads (default: 4)")
    worker.add_argument("--data-dir", help="the data folder (default: SHIFTLOG_DATA_DIR)")
    sub.add_parser("manage", help="run a management command: shiftlog manage help", add_help=False)
    return p


def manage(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shiftlog.settings")
    from django.core.management import execute_from_command_line  # noqa: PLC0415 (after the env)

    execute_from_command_line(["shiftlog manage", *argv])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["manage"]:  # everything after it is the management command's own
        manage(argv[1:])
        return
    o = parser().parse_args(argv)
    if o.data_dir:
        os.environ["SHIFTLOG_DATA_DIR"] = os.path.abspath(o.data_dir)
    if o.command == "worker":
        manage(["run_huey", "-w", str(o.workers), "-k", "thread", "-g", "TERM", "-t", "30"])
        return
    served = ["serve", "--port", str(o.port), "--host", o.host]
    if o.command == "run":
        served += ["--setup", *(["--no-demo"] if o.no_demo else [])]
    elif o.command == "web":
        served += ["--workers", "0"]
    elif o.workers is not None:
        served += ["--workers", str(o.workers)]
    manage(served)


if __name__ == "__main__":
    main()
