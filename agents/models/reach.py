"""Reaching people where they are (agents/slack.py, agents/mail.py): who a person is in Slack
and what they want mailed, where a project's news goes, the Slack messages posted, and the
one-time links mailed. Imported by agents/models.py, which re-exports them.

The bot token and the signing secret are settings (the environment), never rows: nothing here
holds a secret, so the admin cannot show one.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class Reach(models.Model):
    """One person's ways to be reached: their Slack user id (a click in Slack acts as them) and
    which mails they opted in to (only about runs they may see; approvals only if they may
    decide)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="reach"
    )
    slack_user_id = models.CharField(
        max_length=40,
        blank=True,
        help_text="Their Slack member id (U…, in Slack: profile → ⋯ → Copy member ID).",
    )
    mail_approvals = models.BooleanField(
        default=False, help_text="Mail me when a run I may decide on asks for an approval."
    )
    mail_run_endings = models.BooleanField(
        default=False, help_text="Mail me when a run I may see ends (succeeded, failed, cancelled)."
    )

    class Meta:
        verbose_name = "person's notification settings"
        verbose_name_plural = "people's notification settings"
        constraints = [
            models.UniqueConstraint(
                fields=["slack_user_id"],
                condition=~models.Q(slack_user_id=""),
                name="reach_unique_slack_user",
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} (Slack {self.slack_user_id or '-'})"


class ProjectReach(models.Model):
    """Where a project's news is posted in Slack, and which news. The row with a blank project
    is the default for runs of every other project (and runs without one)."""

    project = models.CharField(max_length=100, blank=True, unique=True)
    slack_channel = models.CharField(
        max_length=80, blank=True, help_text="A channel id (C…) or #name the bot was invited to."
    )
    slack_approvals = models.BooleanField(default=True)
    slack_run_endings = models.BooleanField(default=True)
    slack_pauses = models.BooleanField(default=True)
    slack_budget_warnings = models.BooleanField(default=True)

    class Meta:
        verbose_name = "project's Slack channel"
        verbose_name_plural = "projects' Slack channels"

    def __str__(self) -> str:
        return f"{self.project or '(every other project)'} → {self.slack_channel or '-'}"


class SlackMessageKind(models.TextChoices):
    APPROVAL = "approval"
    RUN = "run"  # run ended, paused, budget warning


class SlackMessage(models.Model):
    """A message a run owes a Slack channel: written in the transaction that records its news,
    posted by a huey task after commit (retried with backoff; a Slack outage costs a warning,
    never a run). An approval's message is updated (`stale`) once it is decided, wherever."""

    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="slack_messages")
    approval = models.OneToOneField(
        "agents.Approval",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="slack_message",
    )
    kind = models.CharField(max_length=20, choices=SlackMessageKind.choices)
    channel = models.CharField(max_length=80)
    text = models.TextField(blank=True)  # a run message's news, as words
    ts = models.CharField(max_length=40, blank=True)  # Slack's id of the posted message
    # The posted message no longer shows the approval's state: chat.update it.
    stale = models.BooleanField(default=False)
    attempts = models.PositiveSmallIntegerField(default=0)
    # A task is posting or updating it until then: another task for it leaves it alone.
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"Slack {self.kind} of run {self.run_id} in {self.channel}"


class MailLink(models.Model):
    """A one-time link mailed to one person about one approval: it opens the decision page
    (after logging in, as that person) and is used up by the decision made through it. Held
    (`mailed_at` empty) while it waits for its person's digest."""

    approval = models.ForeignKey(
        "agents.Approval", on_delete=models.CASCADE, related_name="mail_links"
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    mailed_at = models.DateTimeField(null=True, blank=True)
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["pk"]
        indexes = [models.Index(fields=["user", "created_at"], name="maillink_user_recent")]

    def __str__(self) -> str:
        return f"mail link {self.pk} for approval {self.approval_id} to {self.user}"


class SlackLinkClaim(models.Model):
    """A person asked to link a Slack member id to themselves (the page /me/reach/): the bot
    sent that Slack user a button carrying this claim's id, signed and expiring. Only a signed
    click of that Slack user uses it up and saves the link (agents/slack_link.py), so nobody
    can claim another person's Slack id."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    slack_user_id = models.CharField(max_length=40)
    created_at = models.DateTimeField(default=timezone.now)
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["pk"]
        indexes = [models.Index(fields=["user", "created_at"], name="slacklink_user_recent")]

    def __str__(self) -> str:
        return f"Slack link claim {self.pk}: {self.user} as {self.slack_user_id}"
