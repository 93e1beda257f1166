from __future__ import annotations

from django.contrib import admin, messages

from api.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are listed and revoked here; they are made with `manage.py create_token`, which
    shows the token once (only its hash is kept)."""

    list_display = (
        "prefix",
        "name",
        "user",
        "scopes",
        "run",
        "state",
        "created_at",
        "expires_at",
        "last_used_at",
    )
    list_filter = ("revoked_at",)
    search_fields = ("prefix", "name", "user__username")
    readonly_fields = (
        "user",
        "name",
        "prefix",
        "hash",
        "scopes",
        "run",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
    )
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        n = sum(token.revoke() for token in queryset)
        self.message_user(request, f"{n} token(s) revoked.", messages.SUCCESS)
