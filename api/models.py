"""API tokens: only a hash is stored; the token itself is shown once, when it is made."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

SCOPES = ("read", "write", "decide")
PREFIX = "shl_"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def connect_command(base_url: str, token: str, run_id: int) -> str:
    """What puts Claude Code on a run, with a token made for it."""
    return f"SHIFTLOG_URL={base_url} SHIFTLOG_TOKEN={token} shiftlog-claude --run {run_id}"


class TokenQuerySet(models.QuerySet):
    def usable(self) -> TokenQuerySet:
        now = timezone.now()
        return self.filter(revoked_at__isnull=True, user__is_active=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        )


class ApiToken(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True)
    # The first characters, to tell tokens apart in lists; never enough to use one.
    prefix = models.CharField(max_length=12)
    hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    # A token made for one run (the "Connect an agent" card, `create_token --run`, POST
    # /runs/ID/tokens) acts for that run and nothing else, and never decides (api/auth.py).
    run = models.ForeignKey(
        "agents.Run", null=True, blank=True, on_delete=models.CASCADE, related_name="api_tokens"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    objects = TokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        only = f", run {self.run_id} only" if self.run_id else ""
        return f"{self.prefix}… ({self.user}, {','.join(self.scopes)}{only})"

    @classmethod
    def issue(cls, user, scopes: list[str], *, name: str = "", expires_at=None, run=None):
        """A new token: (row, the token itself, which is not kept). With `run`, a token for that
        run only, which may never hold the decide scope."""
        if run is not None and "decide" in scopes:
            raise ValueError("a token made for one run can never decide (not even its approvals)")
        token = PREFIX + secrets.token_urlsafe(32)
        row = cls.objects.create(
            user=user,
            name=name,
            prefix=token[: len(PREFIX) + 6],
            hash=digest(token),
            scopes=list(scopes),
            expires_at=expires_at,
            run=run,
        )
        return row, token

    @classmethod
    def for_run(cls, user, run):
        """A token that acts as `user` for `run` only, to read and drive it (never to decide)."""
        return cls.issue(user, ["read", "write"], name=f"agent of run {run.pk}", run=run)

    @property
    def state(self) -> str:
        if self.revoked_at:
            return "revoked"
        if self.expires_at and self.expires_at <= timezone.now():
            return "expired"
        return "active"

    def revoke(self) -> bool:
        return bool(
            ApiToken.objects.filter(pk=self.pk, revoked_at__isnull=True).update(
                revoked_at=timezone.now()
            )
        )


class IdempotentRequest(models.Model):
    """A POST sent with an `Idempotency-Key` (api/idempotency.py): the same user's same key
    within IDEMPOTENCY_TTL gets the stored answer again, never a second run or call. `status` is
    null while the first request is being answered."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)  # sha256 of method, path, query and body
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    content_type = models.CharField(max_length=100, blank=True)
    body = models.BinaryField(default=b"")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "key"], name="api_idempotency_key_per_user")
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.user_id}, {self.status or 'pending'})"
