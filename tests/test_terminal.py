"""An agent's text reaches people's terminals through the CLI and the logs shown, never obeyed:
escape sequences (a window title, colours, a line wiped and rewritten), carriage returns,
backspaces, C1 controls and bidi overrides print as their escapes (agents/terminal.py)."""

from __future__ import annotations

import logging
from io import StringIO

import pytest
from django.core.management import call_command, get_commands, load_command_class

from agents.management.base import BaseCommand, VisibleOutput
from agents.terminal import visible
from tests.helpers import call, drive_until_idle, finish_turn, make_run

pytestmark = pytest.mark.django_db

HOSTILE = [
    "\x1b]0;owned\x07",  # sets the window title
    "\x1b[31mred\x1b[0m",  # colour
    "evil.example\r\x1b[2Kpypi.org",  # wipes the line and writes another host over it
    "pypi\x08\x08\x08\x08evil",  # backspaces
    "\x9b31m",  # C1 CSI, honoured by some terminals
    "abc\u202egro.ipyp",  # right-to-left override
    "py\u200bpi.org",  # zero-width space
    "one\u2028two",  # line separator
    "\x7f\x00",
]
DANGEROUS = ["\x1b", "\x07", "\r", "\x08", "\x9b", "\u202e", "\u200b", "\u2028", "\x7f", "\x00"]


def assert_inert(text: str) -> None:
    assert not [c for c in DANGEROUS if c in text], repr(text)


@pytest.mark.no_services
@pytest.mark.parametrize("text", HOSTILE)
def test_visible_writes_every_control_character_as_its_escape(text):
    shown = visible(text)
    assert_inert(shown)
    assert shown.isprintable()
    assert shown.encode().decode("unicode_escape") == text  # nothing lost: it reads back


@pytest.mark.no_services
def test_visible_keeps_newlines_tabs_and_plain_unicode():
    text = "a\tb\nnaïve — 日本語 ✓\n"
    assert visible(text) == text
    assert visible("\x1b[1m", keep="") == "\\x1b[1m"


@pytest.mark.no_services
def test_every_shiftlog_command_prints_through_the_visible_base():
    ours = {n: app for n, app in get_commands().items() if app in ("agents", "api")}
    assert "tail_run" in ours and "create_token" in ours
    for name, app in ours.items():
        command = load_command_class(app, name)
        assert isinstance(command, BaseCommand), name
        assert isinstance(command.stdout, VisibleOutput), name
        assert isinstance(command.stderr, VisibleOutput), name


def test_tail_run_and_show_run_print_an_agents_escape_sequences_visibly(owner):
    text = "Looking.\x1b]0;owned\x07 \x1b[8mhidden\x1b[0m \u202eevil"
    run = make_run(
        created_by=owner,
        turns=[
            {"text": text, "tool_calls": [call("bash", command="echo 'evil.example\r\x1b[2K'")]},
            finish_turn("all done\x1b[2J\x9b2J\rpypi.org"),
        ],
    )
    run = drive_until_idle(run)
    for command in ("show_run", "tail_run"):
        out = StringIO()
        call_command(command, str(run.pk), stdout=out)
        printed = out.getvalue()
        assert_inert(printed)
    assert "\\x1b" in printed  # tail_run: shown, not dropped
    # --json was escaped already (json.dumps, ASCII only), and still reads back exactly.
    out = StringIO()
    call_command("tail_run", str(run.pk), "--json", stdout=out)
    assert_inert(out.getvalue())


def test_a_command_error_carrying_an_agents_text_is_printed_visibly():
    # What Django prints for a CommandError goes through the command's stderr.
    command = load_command_class("agents", "show_run")
    err = StringIO()
    command.stderr = type(command.stderr)(err)
    command.stderr.write("CommandError: no such file: \x1b]0;owned\x07")
    assert err.getvalue() == "CommandError: no such file: \\x1b]0;owned\\x07\n"


def test_the_console_log_prints_an_agents_text_visibly():
    handler = logging.getLogger("agents").handlers[0]
    record = logging.LogRecord("agents", logging.INFO, __file__, 1, "ran %s", ("\x1b[2J",), None)
    assert_inert(handler.format(record))
    assert "ran \\x1b[2J" in handler.format(record)
