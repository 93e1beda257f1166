"""A parser for `text/event-stream` (the WHATWG rules), fed one line at a time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SSEMessage:
    event: str
    data: str
    id: str | None
    retry: int | None = None


class SSEParser:
    """Feed lines (without their line ending); `feed` returns a message when a blank line ends
    one. Comment lines (`: keep-alive`) are skipped; `last_id` is the id of the latest message."""

    def __init__(self) -> None:
        self.last_id: str | None = None
        self.retry: int | None = None
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self._retry: int | None = None

    def feed(self, line: str) -> SSEMessage | None:
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)
            self.retry = self._retry
        return None

    def _dispatch(self) -> SSEMessage | None:
        if self._id is not None:
            self.last_id = self._id
        if not self._data and not self._event:
            self._id, self._retry = None, None
            return None
        message = SSEMessage(
            event=self._event or "message",
            data="\n".join(self._data),
            id=self._id if self._id is not None else self.last_id,
            retry=self._retry,
        )
        self._event, self._data, self._id, self._retry = "", [], None, None
        return message
