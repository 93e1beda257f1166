from __future__ import annotations

# WebSocket routes; the live dashboard adds its consumers here.
websocket_urlpatterns: list = []
