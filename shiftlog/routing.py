from __future__ import annotations

from django.urls import path

from dashboard import urls  # noqa: F401 (registers the `id` path converter)
from dashboard.live.consumers import LiveConsumer

# One socket per page (see dashboard.live.consumers); asgi.py wraps these in
# SameOriginValidator(AuthMiddlewareStack(...)).
websocket_urlpatterns = [
    path("ws/live/", LiveConsumer.as_asgi(), {"mode": "page"}),
    path("ws/live/runs/", LiveConsumer.as_asgi(), {"mode": "list"}),
    path("ws/live/approvals/", LiveConsumer.as_asgi(), {"mode": "approvals"}),
    path("ws/live/runs/<id:run_id>/", LiveConsumer.as_asgi(), {"mode": "run"}),
]
