"""The API: /api/v1/, its OpenAPI schema and its docs page.

django-ninja, because its operations are plain typed functions whose pydantic models are the
validation and the OpenAPI 3.1 schema at once, it runs sync and async views side by side (the
event stream and the long-poll wait without holding a thread), and it brings its throttling and
a Swagger UI served from our own static files (no CDN, nothing inline for the CSP to refuse).
"""

from __future__ import annotations

from functools import wraps

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import JsonResponse
from ninja import NinjaAPI

from api import agent_harness, automation, decisions, errors, history, knowledge, runs
from api.auth import Bearer, PerToken, found_token
from api.schemas import Problem


def _logged_in_or_token(view):
    """The schema and the docs page: for people logged in, or a caller with a valid token."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        header = request.headers.get("Authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if request.user.is_authenticated:
            return view(request, *args, **kwargs)
        if found := found_token(token):
            request.user = found.user
            return view(request, *args, **kwargs)
        if request.path.endswith(".json"):
            return JsonResponse(
                {
                    "type": "about:blank",
                    "title": "Unauthorized",
                    "status": 401,
                    "detail": "log in, or send Authorization: Bearer TOKEN",
                },
                status=401,
                content_type=errors.PROBLEM,
            )
        return redirect_to_login(request.get_full_path())

    return wrapped


ERRORS = {
    "400": "The body is not JSON",
    "401": "No token, or an unknown, revoked or expired one",
    "403": "The token lacks the scope, or its user the permission",
    "404": "No such thing, or one the token's user may not see",
    "409": "The run's (or approval's) state does not allow it",
    "413": "The body is too large",
    "422": "The request is not valid: detail names the field",
    "429": "Too many requests for this token: see Retry-After",
}


class Api(NinjaAPI):
    def get_openapi_schema(self, *args, **kwargs):
        """Every operation's errors are documented, as application/problem+json."""
        schema = super().get_openapi_schema(*args, **kwargs)
        problem = {"$ref": "#/components/schemas/Problem"}
        schema["components"].setdefault("schemas", {})["Problem"] = Problem.model_json_schema()
        for operations in schema["paths"].values():
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                for code, text in ERRORS.items():
                    responses.setdefault(
                        code,
                        {
                            "description": text,
                            "content": {errors.PROBLEM: {"schema": problem}},
                        },
                    )
        return schema


api = Api(
    title="Shiftlog API",
    version="1",
    description="Runs, events, approvals, checkpoints and artifacts of Shiftlog, and the "
    "harness calls of external agents. Authenticate with `Authorization: Bearer TOKEN` "
    "(`manage.py create_token`). Errors are application/problem+json.",
    urls_namespace="api",
    auth=Bearer(),
    throttle=[PerToken(settings.SHIFTLOG["API_RATE_PER_MINUTE"])],
    docs_url="/docs",
    openapi_url="/openapi.json",
    docs_decorator=_logged_in_or_token,
)
errors.install(api)
api.add_router("", runs.router)
api.add_router("", history.router)
api.add_router("", decisions.router)
api.add_router("", agent_harness.router)
api.add_router("", automation.router)
api.add_router("", knowledge.router)
