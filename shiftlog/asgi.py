from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shiftlog.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from dashboard import body_limits  # noqa: E402
from dashboard.origins import SameOriginValidator  # noqa: E402
from shiftlog.routing import websocket_urlpatterns  # noqa: E402

# Under daphne, bodies are limited as they arrive and reach the application a chunk at a time.
body_limits.install()

application = ProtocolTypeRouter(
    {
        # No separate web server is needed in front: static files (the stylesheet, htmx and
        # its ws extension, vendored by django-htmx) are served by ServeStatic's middleware,
        # with hashed names once collected (dashboard/staticfiles.py).
        "http": django_asgi_app,
        # Only the page's own origin (scheme, host and port) may open a socket: see origins.py.
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
