"""Shared pieces of the CLI: run lookup, clear errors (exit 2), acting users."""

from __future__ import annotations

import argparse
import getpass

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand as DjangoBaseCommand
from django.core.management.base import CommandError, OutputWrapper

from agents import checkpoints, inputs
from agents.models import Run
from agents.services import RunError
from agents.terminal import visible


def id_arg(text: str) -> int:
    """argparse type for an id: a clear error (exit 2) for what no row can have."""
    try:
        return inputs.object_id(text, what="an id")
    except inputs.InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def seq_arg(text: str) -> int:
    """argparse type for a place in a run's log (0: its beginning)."""
    try:
        return inputs.whole_number(text, what="a seq", minimum=0, maximum=inputs.MAX_BIG_INT)
    except inputs.InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def fail(message: str) -> CommandError:
    return CommandError(message, returncode=2)


def get_run(run_id: int) -> Run:
    try:
        return Run.objects.get(pk=inputs.object_id(run_id, what="a run id"))
    except (Run.DoesNotExist, inputs.InputError):
        raise fail(f"no run with id {run_id}") from None


def acting(username: str | None) -> tuple[object | None, str]:
    """(user, actor) for --user NAME; without it, the shell user is named in the log."""
    if not username:
        return None, f"cli:{getpass.getuser()}"
    try:
        user = get_user_model().objects.get(username=username)
    except get_user_model().DoesNotExist:
        raise fail(f"no user named {username!r}") from None
    return user, f"user:{user.get_username()}"


class VisibleOutput(OutputWrapper):
    """A command's stdout or stderr that shows control characters visibly (agents/terminal.py).
    The command's own styling (applied after, on a terminal) still colours its messages."""

    def write(self, msg: str = "", style_func=None, ending=None) -> None:
        super().write(visible(msg), style_func, ending)

    def write_exact(self, text: str) -> None:
        """Machine output (a patch) as it is to a file or a pipe; to a terminal, visibly."""
        if self.isatty():
            self.write(text, ending="")
        else:
            self._out.write(text)


def _visible_output(stream: OutputWrapper) -> VisibleOutput:
    if isinstance(stream, VisibleOutput):
        return stream
    out = VisibleOutput(stream._out, ending=stream.ending)
    out.style_func = stream._style_func
    return out


class BaseCommand(DjangoBaseCommand):
    """Every Shiftlog command's base: whatever it prints to stdout or stderr (an agent's text
    among it) shows control characters visibly. Django sets `self.stdout`/`self.stderr` in
    `__init__` and `execute`; these properties wrap each one it sets."""

    @property
    def stdout(self) -> VisibleOutput:
        return self._visible_stdout

    @stdout.setter
    def stdout(self, stream: OutputWrapper) -> None:
        self._visible_stdout = _visible_output(stream)

    @property
    def stderr(self) -> VisibleOutput:
        return self._visible_stderr

    @stderr.setter
    def stderr(self, stream: OutputWrapper) -> None:
        self._visible_stderr = _visible_output(stream)


class RunCommand(BaseCommand):
    """A command acting on one run: `ID [--user NAME]`; RunError becomes a clean exit 2."""

    # A quick act on one row: Django's system checks (URLs, admin, templates) would double the
    # command's start-up; `manage.py check` and every server's start run them.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=id_arg, metavar="ID")
        parser.add_argument("--user", help="act as this user (recorded in the log)")

    def execute(self, *args, **options):
        try:
            return super().execute(*args, **options)
        except RunError as e:
            raise fail(str(e)) from None


def named_checkpoint(run_id: int, text: str):
    """A checkpoint as people name it: `N` (checkpoint N of the run) or `RUN:N` (checkpoint N of
    another run, e.g. a fork's origin); a clear error (exit 2) otherwise."""
    run_part, _, number = str(text).rpartition(":")
    if run_part:
        try:
            run_id = inputs.object_id(run_part, what="a run id")
        except inputs.InputError:
            raise fail(f"{text!r}: expected N or RUN:N") from None
    try:
        return checkpoints.by_number(run_id, number)
    except checkpoints.CheckpointError as e:
        raise fail(str(e)) from None
