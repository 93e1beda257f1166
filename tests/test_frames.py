"""Pushed fragments grouped into messages that parse as they read (dashboard/live/frames.py)."""

from __future__ import annotations

import pytest

from dashboard.live.frames import frames

pytestmark = pytest.mark.no_services

COUNT = '<span id="approval-count" hx-swap-oob="true">1</span>'
ROW = '<tr id="run-{}" hx-swap-oob="true"><td>{}</td></tr>'
NEW = '<tbody id="run-rows" hx-swap-oob="afterbegin"><tr id="run-9"><td>9</td></tr></tbody>'
CARD = '<article id="approval-3" hx-swap-oob="true">card</article>'


def test_rows_never_share_a_message_with_the_count():
    rows = [ROW.format(1, 1), ROW.format(2, 2)]
    assert frames([COUNT, *rows]) == [COUNT, "".join(rows)]
    assert frames([*rows, COUNT]) == ["".join(rows), COUNT]


def test_fragments_of_one_kind_share_a_message_in_order():
    assert frames([COUNT, CARD]) == [COUNT + CARD]
    assert frames([NEW, ROW.format(1, 1)]) == [NEW + ROW.format(1, 1)]
    assert frames([COUNT, ROW.format(1, 1), CARD]) == [COUNT, ROW.format(1, 1), CARD]


def test_nothing_to_send_is_no_message():
    assert frames([]) == [] and frames(["", ""]) == []
    assert frames(["\n  <TR id=x></TR>"]) == ["\n  <TR id=x></TR>"]
