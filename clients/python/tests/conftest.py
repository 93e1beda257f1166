"""Fixtures of the client's tests (the helpers themselves are in client_helpers.py)."""

from __future__ import annotations

from client_helpers import make_client

__all__ = ["make_client"]
