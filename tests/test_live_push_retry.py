"""The committing process's pusher (dashboard/live/hub.py) keeps events it could not publish while
Redis was away and sends them, in order, once it is back: a run's last event has no later event
to make a page read the gap from the database."""

from __future__ import annotations

import pytest

from dashboard.live import hub

pytestmark = pytest.mark.no_services


class FlakyLayer:
    """A channel layer whose first `failures` sends fail as a Redis restart makes them fail."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.sent: list[list[int]] = []

    async def group_send(self, group: str, message: dict) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        self.sent.append([row["seq"] for row in message["rows"]])


def pushed(layer: FlakyLayer, monkeypatch, *batches: list[int]) -> FlakyLayer:
    monkeypatch.setattr(hub, "get_channel_layer", lambda alias=None: layer)
    pusher = hub.Pusher()
    for seqs in batches:
        pusher.push([{"seq": q} for q in seqs])
    assert pusher.flush(timeout=20)
    return layer


def test_events_pushed_while_redis_is_away_are_sent_in_order_once_it_is_back(monkeypatch):
    monkeypatch.setattr(hub, "PUSH_RETRY_SECONDS", 10.0)
    layer = pushed(FlakyLayer(failures=3), monkeypatch, [108], [109])
    assert [q for batch in layer.sent for q in batch] == [108, 109]


def test_after_the_retry_window_the_events_are_left_to_the_pages_reconnects(monkeypatch, caplog):
    monkeypatch.setattr(hub, "PUSH_RETRY_SECONDS", 0.3)
    layer = pushed(FlakyLayer(failures=1000), monkeypatch, [7])
    assert layer.sent == []
    assert "pushing 1 event(s) failed; giving up" in caplog.text
