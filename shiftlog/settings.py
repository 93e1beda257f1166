"""Shiftlog settings, driven by environment variables.

The defaults are the embedded mode: SQLite (WAL, IMMEDIATE transactions) and SqliteHuey in its
own file under SHIFTLOG_DATA_DIR. DATABASE_URL and REDIS_URL switch to PostgreSQL, RedisHuey and
channels-redis. A bad value fails loudly at start-up rather than being guessed around.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
from datetime import timedelta
from pathlib import Path

from csp import constants as csp
from django.core.exceptions import ImproperlyConfigured

from shiftlog.extras import require

BASE_DIR = Path(__file__).resolve().parent.parent
# A checkout has manage.py beside the apps; an installed package (`pip install shiftlog`) has its
# templates and static files inside the `dashboard` package (setup.py copies them there).
CHECKOUT = (BASE_DIR / "manage.py").exists()
ASSETS_DIR = BASE_DIR if CHECKOUT else BASE_DIR / "dashboard" / "assets"
# How pages and set-up name a management command to the person running this copy.
MANAGE_COMMAND = ".venv/bin/python manage.py" if CHECKOUT else "shiftlog manage"


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, not {raw!r}")


def env_number(name: str, default: float, cast: type = int) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = cast(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, not {raw!r}") from None
    if value < 0:
        raise ImproperlyConfigured(f"{name} must not be negative, not {raw!r}")
    return value


def _default_data_dir() -> Path:
    """var/ in a checkout; for an installed package, the user's data folder (XDG)."""
    if CHECKOUT:
        return BASE_DIR / "var"
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "shiftlog"


DATA_DIR = Path(env_str("SHIFTLOG_DATA_DIR") or _default_data_dir()).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("SHIFTLOG_DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    # The embedded mode keeps a random key in the data folder so sessions and one-time login
    # links survive restarts without anyone having to invent a secret.
    key_file = DATA_DIR / "secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    SECRET_KEY = key_file.read_text().strip()

ALLOWED_HOSTS = [h for h in env_str("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in env_str("CSRF_TRUSTED_ORIGINS").split(",") if o]


def _base_url() -> str:
    """Where the server is reached: SHIFTLOG_BASE_URL, else the address the last `serve` on this
    data folder recorded (so `manage.py login_link` in another terminal prints a link to the port
    actually served), else port 8000 of this machine."""
    named = env_str("SHIFTLOG_BASE_URL").strip()
    if not named:
        recorded = DATA_DIR / "server_url"
        named = recorded.read_text().strip() if recorded.is_file() else ""
        if not named.startswith(("http://", "https://")):
            named = "http://127.0.0.1:8000"
    if not named.startswith(("http://", "https://")):
        raise ImproperlyConfigured(
            f"SHIFTLOG_BASE_URL must start with http:// or https://, not {named!r}"
        )
    return named.rstrip("/")


SHIFTLOG_BASE_URL = _base_url()

# Behind a TLS-terminating reverse proxy (which sets X-Forwarded-Proto): cookies only over
# HTTPS, plain HTTP redirected (the health endpoints excepted, for load balancers), and HSTS
# when SHIFTLOG_HSTS_SECONDS says for how long.
if env_bool("SHIFTLOG_HTTPS", False):
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
    SECURE_HSTS_SECONDS = int(env_number("SHIFTLOG_HSTS_SECONDS", 0))

# The client's address, for login throttling, is the one the outermost of this many trusted
# proxies saw (X-Forwarded-For, read from the right: dashboard/client_ip.py); 0 reads only the
# connection's address. Behind the TLS proxy SHIFTLOG_HTTPS declares, one by default.
SHIFTLOG_TRUSTED_PROXIES = int(
    env_number("SHIFTLOG_TRUSTED_PROXIES", 1 if env_bool("SHIFTLOG_HTTPS", False) else 0)
)
if SHIFTLOG_TRUSTED_PROXIES > 10:
    raise ImproperlyConfigured(
        f"SHIFTLOG_TRUSTED_PROXIES must be 0 to 10, not {SHIFTLOG_TRUSTED_PROXIES}"
    )
AXES_CLIENT_IP_CALLABLE = "dashboard.client_ip.client_ip"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "channels",
    "huey.contrib.djhuey",
    "axes",
    "csp",
    "agents",
    "dashboard",
    "api",
    "ninja",  # its Swagger UI from our static files (without it, from a CDN the CSP refuses)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files under ASGI (ServeStatic): hashed names from collectstatic's manifest are
    # cached for good (a new deploy has new names, so browsers fetch it at once).
    "servestatic.middleware.ServeStaticMiddleware",
    # Every request gets an id (X-Request-ID, taken from a proxy when it sends a sane one), on
    # its response and on every log line written while it is served (agents/logcontext.py).
    "dashboard.middleware.RequestIdMiddleware",
    "dashboard.middleware.Utf8OnlyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # A retried API POST with the same Idempotency-Key gets the first answer (api/idempotency.py).
    "api.idempotency.idempotency_middleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: it answers a locked-out login with the lockout page.
    "axes.middleware.AxesMiddleware",
]

# A strict Content-Security-Policy on every page (django-csp): scripts, styles, images and
# sockets from this origin only, nothing inline, no framing. With it, nosniff (Django's default)
# and X-Frame-Options: DENY. Artifacts are downloaded (Content-Disposition: attachment) with a
# policy of their own that runs nothing (dashboard.views.artifact_download).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [csp.SELF],
        "script-src": [csp.SELF],
        "style-src": [csp.SELF],
        "img-src": [csp.SELF, "data:"],
        "connect-src": [csp.SELF],
        "font-src": [csp.SELF],
        "object-src": [csp.NONE],
        "base-uri": [csp.NONE],
        "form-action": [csp.SELF],
        "frame-ancestors": [csp.NONE],
    }
}
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

# Login throttling (django-axes): after SHIFTLOG_LOGIN_FAILURES wrong passwords for one account,
# or from one address, logins from it are refused for SHIFTLOG_LOGIN_LOCKOUT_MINUTES (a correct
# password too); the one-time login link counts its wrong tokens the same way. Admins see the
# attempts in the admin; `manage.py unlock_login` lifts a lockout.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = int(env_number("SHIFTLOG_LOGIN_FAILURES", 5)) or 5
AXES_COOLOFF_TIME = timedelta(minutes=env_number("SHIFTLOG_LOGIN_LOCKOUT_MINUTES", 15, float))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # each on its own: an account, an address
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"

ROOT_URLCONF = "shiftlog.urls"
ASGI_APPLICATION = "shiftlog.asgi.application"
WSGI_APPLICATION = "shiftlog.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [ASSETS_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    import dj_database_url

    # A bounded pool of connections per process (psycopg_pool), whatever the thread count: a
    # thread takes a connection only while it uses the database and gives it back before a
    # model call or a tool run (agents/dbconn.py), so hundreds of worker threads share
    # SHIFTLOG_DB_POOL_SIZE connections. A thread that finds none free waits up to
    # SHIFTLOG_DB_POOL_TIMEOUT seconds; a slice that still gets none is retried with backoff
    # (agents.runtime.loop.drive). SHIFTLOG_DB_POOL_SIZE=0 turns the pool off (a connection per
    # thread, kept SHIFTLOG_DB_CONN_MAX_AGE seconds).
    DB_POOL_SIZE = int(env_number("SHIFTLOG_DB_POOL_SIZE", 20))
    if DB_POOL_SIZE:
        DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
        DB_POOL_MIN = int(env_number("SHIFTLOG_DB_POOL_MIN", 2))
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": min(DB_POOL_MIN, DB_POOL_SIZE),
            "max_size": DB_POOL_SIZE,
            "timeout": env_number("SHIFTLOG_DB_POOL_TIMEOUT", 30.0, float),
        }
    else:
        DATABASES = {
            "default": dj_database_url.parse(
                DATABASE_URL, conn_max_age=int(env_number("SHIFTLOG_DB_CONN_MAX_AGE", 60))
            )
        }
    if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured("DATABASE_URL must be a postgres:// URL (or unset for SQLite)")
    require("postgres", "DATABASE_URL (PostgreSQL)")
else:
    # How hard SQLite syncs a commit (SHIFTLOG_SQLITE_SYNC). NORMAL, the default: in WAL mode a
    # commit is safe against a crash of the process or of the operating system's view of it, but
    # the last commits before a power loss (or a kernel panic) may be lost; the database itself
    # is never corrupted, and a run resumes from what survived. FULL: every commit is fsynced
    # before it returns, so nothing acknowledged is lost even to a power loss, at the cost of an
    # fsync per commit (README, "Step overhead", has both).
    SQLITE_SYNC = env_str("SHIFTLOG_SQLITE_SYNC", "NORMAL").strip().upper() or "NORMAL"
    if SQLITE_SYNC not in {"NORMAL", "FULL"}:
        raise ImproperlyConfigured(
            f"SHIFTLOG_SQLITE_SYNC must be NORMAL or FULL, not {os.environ['SHIFTLOG_SQLITE_SYNC']!r}"
        )
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env_str("SHIFTLOG_DB", str(DATA_DIR / "db.sqlite3")),
            # Two processes (web + worker) write: IMMEDIATE takes the write lock up front, so a
            # read-modify-write transaction never fails half-way with "database is locked".
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": f"PRAGMA journal_mode=WAL;PRAGMA synchronous={SQLITE_SYNC};",
            },
            "TEST": {"NAME": env_str("SHIFTLOG_TEST_DB", str(DATA_DIR / "test-db.sqlite3"))},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    require("redis", "REDIS_URL")
# "api": the API's per-token request counts, shared by every web process when Redis is there.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "api": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "api"}
    if not REDIS_URL
    else {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": env_str("SHIFTLOG_HUEY_NAME", "shiftlog") + "-api",
    },
}
HUEY_IMMEDIATE = env_bool("SHIFTLOG_HUEY_IMMEDIATE", False)
if REDIS_URL:
    HUEY = {
        "huey_class": "agents.worker.RedisHuey",
        "name": env_str("SHIFTLOG_HUEY_NAME", "shiftlog"),
        "url": REDIS_URL,
        "immediate": HUEY_IMMEDIATE,
    }
    CHANNEL_LAYERS = {
        # Each web process's own sockets: the hub listener fans out to them (dashboard.live.feed).
        "default": {"BACKEND": "channels.layers.InMemoryChannelLayer"},
        # Between processes: committed events, published once per commit to every web process.
        "hub": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        },
    }
else:
    HUEY = {
        "huey_class": "agents.worker.SqliteHuey",
        "name": "shiftlog",
        # Its own file: huey's polling never contends with the Django database's write lock.
        "filename": env_str("SHIFTLOG_HUEY_DB", str(DATA_DIR / "huey.sqlite3")),
        "immediate": HUEY_IMMEDIATE,
    }
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# Nobody reads a task's return value: storing one per slice would only grow the queue's storage.
HUEY["results"] = False
HUEY["consumer"] = {
    "workers": int(env_number("SHIFTLOG_WORKERS", 2)),
    "worker_type": "thread",
    # SIGTERM lets the running step finish; the run stays resumable.
    "graceful_signal": "TERM",
    "shutdown_timeout": 30,
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/admin/login/"
LOGIN_REDIRECT_URL = "/"

# --- dashboard (live UI) ---------------------------------------------------------------------
# The dashboard's own login page; every page's header shows the live count of waiting approvals.
LOGIN_URL = "login"
# A supervisor lands on the Overview (dashboard/overview_views.py).
LOGIN_REDIRECT_URL = "overview"
LOGOUT_REDIRECT_URL = "login"
TEMPLATES[0]["OPTIONS"]["context_processors"].append("dashboard.context_processors.header")
# --- end dashboard ---------------------------------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# `collectstatic` (make run, `shiftlog run`, a deploy's release step) writes the files here with
# hashed names and a manifest; until it has run, pages name the plain files, found in the apps.
STATIC_ROOT = Path(env_str("SHIFTLOG_STATIC_ROOT") or DATA_DIR / "static")
STATICFILES_DIRS = [ASSETS_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "dashboard.staticfiles.HashedStaticFilesStorage"},
}
SERVESTATIC_USE_FINDERS = True  # the plain files too, for a checkout not collected yet

# SHIFTLOG_LOG_FORMAT=json: one JSON object a line (python-json-logger), for a log pipeline; every
# line carries the run id, the session and the request id (null where there is none).
LOG_FORMAT = env_str("SHIFTLOG_LOG_FORMAT", "plain").strip().lower() or "plain"
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"SHIFTLOG_LOG_FORMAT must be plain or json, not {LOG_FORMAT!r}")
LOG_LEVEL = env_str("SHIFTLOG_LOG_LEVEL", "INFO").upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "agents.logcontext.ContextFilter"}},
    "formatters": {
        "plain": {
            "()": "agents.logcontext.PlainFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s%(context)s: %(message)s",
        },
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
            "static_fields": {"service": "shiftlog"},
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["context"],
        }
    },
    "loggers": {
        "agents": {"handlers": ["console"], "level": LOG_LEVEL},
        "dashboard": {"handlers": ["console"], "level": LOG_LEVEL},
        "api": {"handlers": ["console"], "level": LOG_LEVEL},
        "huey": {"handlers": ["console"], "level": "INFO"},
        # Errors and refused requests (Django logs them nowhere by default without DEBUG).
        "django": {"handlers": ["console"], "level": "WARNING", "propagate": False},
    },
}


# --- Shiftlog itself -------------------------------------------------------------------------
def _tool_policy() -> list:
    # Deferred: settings are read before anything of the project's is imported (agents.policy
    # is plain Python, so importing it here is safe; at the top it would load for every setting).
    from agents.policy import PolicyError, validate  # noqa: PLC0415

    try:
        return validate(json.loads(env_str("SHIFTLOG_TOOL_POLICY", "[]")))
    except (ValueError, PolicyError) as e:
        raise ImproperlyConfigured(f"SHIFTLOG_TOOL_POLICY: {e}") from None


def _webhook_secret() -> str:
    """The key webhooks are signed with (Standard Webhooks: whsec_ and base64). Without
    SHIFTLOG_WEBHOOK_SECRET, one is made once and kept in the data folder, like the secret key;
    `manage.py webhook_secret` prints it for the receivers."""
    secret = env_str("SHIFTLOG_WEBHOOK_SECRET")
    if not secret:
        path = DATA_DIR / "webhook_secret"
        if not path.exists():
            path.write_text("whsec_" + base64.b64encode(secrets.token_bytes(32)).decode())
            path.chmod(0o600)
        secret = path.read_text().strip()
    body = secret.removeprefix("whsec_")
    try:
        ok = secret.startswith("whsec_") and len(base64.b64decode(body, validate=True)) >= 24
    except ValueError:
        ok = False
    if not ok:
        raise ImproperlyConfigured(
            "SHIFTLOG_WEBHOOK_SECRET must be whsec_ followed by at least 24 bytes in base64"
        )
    return secret


def _webhook_urls() -> list[str]:
    from agents.inputs import InputError, http_url  # noqa: PLC0415 (as _tool_policy)

    try:
        return [
            http_url(u, what="a webhook URL")
            for u in env_str("SHIFTLOG_WEBHOOK_URLS").split(",")
            if u.strip()
        ]
    except InputError as e:
        raise ImproperlyConfigured(f"SHIFTLOG_WEBHOOK_URLS: {e}") from None


def _otel_endpoint() -> str:
    from agents.inputs import InputError, http_url  # noqa: PLC0415 (as _tool_policy)

    raw = env_str("OTEL_EXPORTER_OTLP_ENDPOINT").strip()
    try:
        return http_url(raw, what="the collector's URL") if raw else ""
    except InputError as e:
        raise ImproperlyConfigured(f"OTEL_EXPORTER_OTLP_ENDPOINT: {e}") from None


SHIFTLOG = {
    # An event payload that its kind's model (agents/events.py) does not accept: refused at write
    # when on (the tests), else written as given and logged as an error: a run never fails over
    # the shape of its own record.
    "STRICT_EVENTS": env_bool("SHIFTLOG_STRICT_EVENTS", False),
    "WORKSPACE_ROOT": Path(env_str("SHIFTLOG_WORKSPACES", str(DATA_DIR / "workspaces"))),
    "BLOB_ROOT": Path(env_str("SHIFTLOG_BLOBS", str(DATA_DIR / "blobs"))),
    # Where blobs live: unset or a folder path = the folder BLOB_ROOT (the embedded default);
    # "s3://BUCKET/PREFIX" = S3-compatible object storage, configured through boto3's own
    # environment and config files (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, profiles...).
    "BLOB_STORE": env_str("SHIFTLOG_BLOB_STORE"),
    # A worker's claim on a run; renewed at every step and while a tool runs.
    "LEASE_SECONDS": env_number("SHIFTLOG_LEASE_SECONDS", 30.0, float),
    # A queued run no worker has claimed for this long is enqueued again by the reaper.
    "REQUEUE_AFTER_SECONDS": env_number("SHIFTLOG_REQUEUE_AFTER_SECONDS", 60.0, float),
    "REAPER_INTERVAL_SECONDS": env_number("SHIFTLOG_REAPER_INTERVAL", 5.0, float),
    # A slice that meets a busy or unreachable database ("too many clients", no pooled
    # connection free, the server restarting) is tried again with backoff for this long; then
    # its run is paused with the reason (PauseCause.DATABASE), and the reaper resumes it.
    "DB_RETRY_SECONDS": env_number("SHIFTLOG_DB_RETRY_SECONDS", 300.0, float),
    # Model calls waited on at once per process (each on a thread of its own while the worker
    # thread keeps the lease): at least the worker threads, so none waits for another's call.
    "MODEL_THREADS": int(env_number("SHIFTLOG_MODEL_THREADS", 512)) or 512,
    # One huey task drives a run for at most this long, then re-enqueues it (fairness).
    "SLICE_SECONDS": env_number("SHIFTLOG_SLICE_SECONDS", 120.0, float),
    "BASH_TIMEOUT_SECONDS": env_number("SHIFTLOG_BASH_TIMEOUT", 120.0, float),
    "CHECK_TIMEOUT_SECONDS": env_number("SHIFTLOG_CHECK_TIMEOUT", 600.0, float),
    "TOOL_OUTPUT_LIMIT": int(env_number("SHIFTLOG_TOOL_OUTPUT_LIMIT", 30_000)),
    "ISOLATION": env_str("SHIFTLOG_ISOLATION", ""),  # "" = best available, or "subprocess"
    # Without bubblewrap a run's commands would have the worker's reach: refuse such runs unless
    # the operator says otherwise (agents/isolation.py).
    "ALLOW_UNISOLATED": env_bool("SHIFTLOG_ALLOW_UNISOLATED", False),
    # The egress proxy refuses hosts that resolve to private or loopback addresses (this
    # machine's database, Redis, web server...) whatever the rules say, unless this is set.
    "EGRESS_ALLOW_PRIVATE": env_bool("SHIFTLOG_EGRESS_ALLOW_PRIVATE", False),
    "WEBHOOK_ALLOW_PRIVATE": env_bool("SHIFTLOG_WEBHOOK_ALLOW_PRIVATE", False),
    # Per-command limits and the workspace's cap; each run may set its own.
    "LIMITS": {
        "memory_mb": int(env_number("SHIFTLOG_MAX_MEMORY_MB", 2048)),
        "processes": int(env_number("SHIFTLOG_MAX_PROCESSES", 512)),
        "cpu_seconds": int(env_number("SHIFTLOG_MAX_CPU_SECONDS", 1800)),
        "workspace_mb": int(env_number("SHIFTLOG_MAX_WORKSPACE_MB", 5120)),
    },
    # The free space (MB) a run's command must leave on its workspace's filesystem (for the
    # database and everything else there): a command going below it is killed (0: no floor).
    "MIN_FREE_MB": int(env_number("SHIFTLOG_MIN_FREE_MB", 1024)),
    "ANTHROPIC_API_KEY": env_str("ANTHROPIC_API_KEY"),
    "ANTHROPIC_BASE_URL": env_str("ANTHROPIC_BASE_URL") or None,
    "ANTHROPIC_MAX_RETRIES": int(env_number("SHIFTLOG_ANTHROPIC_MAX_RETRIES", 4)),
    # Validate every API response strictly against the SDK's types (tests turn it on).
    "ANTHROPIC_STRICT": env_bool("SHIFTLOG_ANTHROPIC_STRICT", False),
    # The demo's simulated model latency, so people can watch it work.
    "DEMO_TURN_DELAY_SECONDS": env_number("SHIFTLOG_DEMO_TURN_DELAY", 1.0, float),
    # Tool policy rules applied after each run's own (JSON list; see agents/policy.py).
    "TOOL_POLICY": _tool_policy(),
    "APPROVAL_TIMEOUT_SECONDS": env_number("SHIFTLOG_APPROVAL_TIMEOUT", 0, int) or None,
    # At most this many approvals asked at once by one command (a turn's calls, a command's new
    # hosts), and by one run since a person last resumed it; past either the run pauses saying
    # why (agents/approvals.py, `flood`). 0: no cap.
    "APPROVALS_PER_COMMAND": int(env_number("SHIFTLOG_APPROVALS_PER_COMMAND", 20)),
    "APPROVALS_PER_RUN": int(env_number("SHIFTLOG_APPROVALS_PER_RUN", 100)),
    # In bubblewrap, code the classifier cannot read (python -c, node -e) runs without asking,
    # as `python script.py` does (agents/policy.py, `decide`); set this to ask about it anyway.
    "ASK_OPAQUE_IN_SANDBOX": env_bool("SHIFTLOG_ASK_OPAQUE_IN_SANDBOX", False),
    "WEBHOOK_URLS": _webhook_urls(),
    "WEBHOOK_SECRET": _webhook_secret(),
    "WEBHOOK_ATTEMPTS": int(env_number("SHIFTLOG_WEBHOOK_ATTEMPTS", 5)),
    "WEBHOOK_BACKOFF_SECONDS": env_number("SHIFTLOG_WEBHOOK_BACKOFF", 2.0, float),
    # A checkpoint after every N file-changing tool calls (0: only at session ends and approvals).
    "CHECKPOINT_EVERY": int(env_number("SHIFTLOG_CHECKPOINT_EVERY", 10)),
    # Workspaces as each host's cache: every tool call that changed the workspace is stored
    # before its result commits, and a worker restores a run's workspace where it claims it.
    # On by default with an S3 store (no shared folders); SHIFTLOG_WORKSPACE_CACHE=1/0 overrides.
    "WORKSPACE_CACHE": env_bool(
        "SHIFTLOG_WORKSPACE_CACHE", env_str("SHIFTLOG_BLOB_STORE").startswith("s3://")
    ),
    # This host's name in events (workspace.restored) and leases; the machine's by default.
    "HOST": env_str("SHIFTLOG_HOST") or socket.gethostname(),
    # A host keeps at most this much of other runs' workspaces (least recently used go first).
    "WORKSPACE_CACHE_MB": int(env_number("SHIFTLOG_WORKSPACE_CACHE_MB", 10240)),
    # A worker watches the workspace it drives (inotify) so checkpoints look only at what changed.
    "CHANGE_FEED": env_bool("SHIFTLOG_CHANGE_FEED", True),
    # A file outside every workspace where each tool call appends a line before it runs
    # (agents/runtime/ledger.py): an outside record of what ran, for soak tests; unset: none.
    "TOOL_LEDGER": env_str("SHIFTLOG_TOOL_LEDGER"),
    # Run the checks at every session end too, so the ratchet sees progress slip between finishes.
    "CHECKS_AT_SESSION_END": env_bool("SHIFTLOG_CHECKS_AT_SESSION_END", True),
    # A worker runs those checks while the next session starts (its first model call), and
    # the session's first tool call waits for them; off: the session change waits instead.
    "DEFER_SESSION_CHECKS": env_bool("SHIFTLOG_DEFER_SESSION_CHECKS", True),
    # After a handoff the next session starts in the same slice when it has time left (off:
    # every session change ends the slice and the run is queued again).
    "NEXT_SESSION_IN_SLICE": env_bool("SHIFTLOG_NEXT_SESSION_IN_SLICE", True),
    # The Overview page: a running or verifying run with no event for this long looks stuck.
    "STUCK_MINUTES": int(env_number("SHIFTLOG_STUCK_MINUTES", 10)),
    # /readyz and /metrics: with a token, callers send `Authorization: Bearer TOKEN`; without
    # one, they are for logged-in staff only.
    "METRICS_TOKEN": env_str("SHIFTLOG_METRICS_TOKEN"),
    # Live pages: with a channel layer shared by every process (Redis), the process that commits
    # events publishes them; without one, each web process tails the event log (dashboard.live.feed).
    "LIVE_PUSH": bool(REDIS_URL),
    # Per-session defaults; each run may set its own.
    "MAX_TURNS_PER_SESSION": int(env_number("SHIFTLOG_MAX_TURNS_PER_SESSION", 40)),
    "MAX_INPUT_TOKENS_PER_SESSION": int(env_number("SHIFTLOG_MAX_INPUT_TOKENS", 150_000)),
    # How much memory (estimated tokens) a session's first message carries; the rest is listed
    # by key (agents/memory.py).
    "MEMORY_WAKE_TOKENS": int(env_number("SHIFTLOG_MEMORY_WAKE_TOKENS", 2000)),
    # External runs: an agent silent for this long shows as stalled (each run may set its own).
    "EXTERNAL_HEARTBEAT_SECONDS": int(env_number("SHIFTLOG_EXTERNAL_HEARTBEAT_SECONDS", 300)),
    # The API: requests per minute per token, and the largest body (a workspace upload).
    "API_RATE_PER_MINUTE": int(env_number("SHIFTLOG_API_RATE_PER_MINUTE", 600)),
    "API_MAX_UPLOAD_MB": int(env_number("SHIFTLOG_API_MAX_UPLOAD_MB", 512)),
    # Inbound webhooks (/hooks/<token>/): deliveries a minute per trigger, and the largest body.
    "HOOK_RATE_PER_MINUTE": int(env_number("SHIFTLOG_HOOK_RATE_PER_MINUTE", 60)),
    "HOOK_MAX_BODY_KB": int(env_number("SHIFTLOG_HOOK_MAX_BODY_KB", 1024)),
    # The longest a tool call's long-poll (?wait=) holds before answering "pending".
    "API_MAX_WAIT_SECONDS": env_number("SHIFTLOG_API_MAX_WAIT_SECONDS", 60.0, float),
    # An event stream is closed after this long; clients reconnect with Last-Event-ID.
    "API_STREAM_SECONDS": env_number("SHIFTLOG_API_STREAM_SECONDS", 600.0, float),
    # An OpenTelemetry collector (OTLP over HTTP): each session that ends, and each run, is sent
    # to it as part of the run's one trace (agents/telemetry.py). Empty: nothing is exported.
    "OTEL_ENDPOINT": _otel_endpoint(),
    # Model and tool content on the spans (GenAI gen_ai.input/output.messages, the tool's
    # arguments and result): off unless asked for; each text cut to OTEL_CONTENT_CHARS, secrets
    # the log knows redacted (agents/trace_content.py).
    "OTEL_CONTENT": env_bool("SHIFTLOG_OTEL_CONTENT", False),
    "OTEL_CONTENT_CHARS": int(env_number("SHIFTLOG_OTEL_CONTENT_CHARS", 4000)),
    # Fleets (agents/fleets/spawn.py): how deep runs may spawn runs (a root is depth 0), and how
    # many children one spawn_runs call may start. Beyond them the tool answers with an error.
    "FLEET_MAX_DEPTH": int(env_number("SHIFTLOG_FLEET_MAX_DEPTH", 2)),
    "FLEET_MAX_CHILDREN": int(env_number("SHIFTLOG_FLEET_MAX_CHILDREN", 8)),
    # Slack (agents/slack.py; docs/deploy.md): the bot's token and the app's signing secret come
    # from the environment only (never a row, never shown); the channel when a project names none.
    "SLACK_BOT_TOKEN": env_str("SHIFTLOG_SLACK_BOT_TOKEN"),
    "SLACK_SIGNING_SECRET": env_str("SHIFTLOG_SLACK_SIGNING_SECRET"),
    "SLACK_CHANNEL": env_str("SHIFTLOG_SLACK_CHANNEL"),
    "SLACK_API_URL": env_str("SHIFTLOG_SLACK_API_URL", "https://slack.com/api/"),
    "SLACK_ATTEMPTS": int(env_number("SHIFTLOG_SLACK_ATTEMPTS", 5)),
    "SLACK_BACKOFF_SECONDS": env_number("SHIFTLOG_SLACK_BACKOFF", 2.0, float),
    # How long the "Link to NAME" button a person has the bot send them works (once).
    "SLACK_LINK_SECONDS": int(env_number("SHIFTLOG_SLACK_LINK_SECONDS", 900)),
    # Mail (agents/mail.py) to the people who opted in, through Django's email backend (EMAIL_*):
    # one-time links valid this long; more than DIGEST_AFTER approval mails to one person within
    # DIGEST_SECONDS and the rest wait for one digest.
    "MAIL_NOTIFICATIONS": env_bool("SHIFTLOG_MAIL_NOTIFICATIONS", True),
    "MAIL_LINK_SECONDS": int(env_number("SHIFTLOG_MAIL_LINK_SECONDS", 86400)),
    "MAIL_DIGEST_AFTER": int(env_number("SHIFTLOG_MAIL_DIGEST_AFTER", 3)),
    "MAIL_DIGEST_SECONDS": int(env_number("SHIFTLOG_MAIL_DIGEST_SECONDS", 600)),
}

EMAIL_BACKEND = env_str("SHIFTLOG_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env_str("SHIFTLOG_EMAIL_HOST", "localhost")
EMAIL_PORT = int(env_number("SHIFTLOG_EMAIL_PORT", 25))
EMAIL_HOST_USER = env_str("SHIFTLOG_EMAIL_USER")
EMAIL_HOST_PASSWORD = env_str("SHIFTLOG_EMAIL_PASSWORD")
EMAIL_USE_TLS = env_bool("SHIFTLOG_EMAIL_TLS", False)
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = env_str("SHIFTLOG_EMAIL_FROM", "shiftlog@localhost")

if SHIFTLOG["BLOB_STORE"].startswith("s3://"):
    require("s3", "SHIFTLOG_BLOB_STORE (an s3:// store)")
if SHIFTLOG["OTEL_ENDPOINT"] or env_str("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
    require("otel", "OTEL_EXPORTER_OTLP_ENDPOINT (an OpenTelemetry collector)")
if SHIFTLOG["SLACK_BOT_TOKEN"] or SHIFTLOG["SLACK_SIGNING_SECRET"]:
    require("slack", "SHIFTLOG_SLACK_BOT_TOKEN (Slack approvals)")
if SHIFTLOG["ANTHROPIC_API_KEY"]:
    require("claude", "ANTHROPIC_API_KEY (runs driven by Claude)")
