"""Which optional part of the package (an extra) a setting needs, checked at start-up.

The embedded mode (SQLite, a SqliteHuey file, a blob folder, scripted runs) needs none of them;
a setting that names PostgreSQL, Redis, S3, an OTLP collector or Claude needs its extra installed
(`pip install 'shiftlog[postgres]'`, …), and without it the process stops at start-up with a
sentence naming the extra, rather than failing later at the first query, task or run.
"""

from __future__ import annotations

import importlib.util

from django.core.exceptions import ImproperlyConfigured

# extra -> the modules it brings (pyproject.toml [project.optional-dependencies])
EXTRAS: dict[str, tuple[str, ...]] = {
    "postgres": ("psycopg",),
    "redis": ("redis", "channels_redis"),
    "s3": ("boto3",),
    "otel": ("opentelemetry.exporter.otlp.proto.http",),
    "claude": ("anthropic",),
    "slack": ("slack_sdk",),
}


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def missing(extra: str) -> list[str]:
    return [m for m in EXTRAS[extra] if not installed(m)]


def require(extra: str, setting: str) -> None:
    """Stop with a clear error when `setting` is set and `extra` is not installed."""
    if absent := missing(extra):
        raise ImproperlyConfigured(
            f"{setting} needs the {extra} extra, which is not installed (no {', '.join(absent)}): "
            f"pip install 'shiftlog[{extra}]' (or 'shiftlog[all]'); in a checkout, make setup"
        )
