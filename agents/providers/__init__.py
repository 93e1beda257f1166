"""Model providers: `scripted` (offline, the default) and `anthropic` (the real Messages API)."""

from __future__ import annotations

from django.conf import settings

from agents.models import RunScript
from agents.providers.base import Provider, ProviderRequestError
from agents.providers.scripted import ScriptedProvider


def for_run(run) -> Provider:
    if run.provider == "scripted":
        script = RunScript.objects.filter(run_id=run.pk).values_list("script", flat=True).first()
        if script is None:
            raise ValueError(f"run {run.pk} is scripted but has no script")
        return ScriptedProvider(script)
    if run.provider == "anthropic":
        # Deferred: the SDK takes about a second to import; only workers driving such runs pay.
        from agents.providers.anthropic import AnthropicProvider  # noqa: PLC0415

        config = settings.SHIFTLOG
        return AnthropicProvider(
            api_key=config["ANTHROPIC_API_KEY"],
            base_url=config["ANTHROPIC_BASE_URL"],
            max_retries=config["ANTHROPIC_MAX_RETRIES"],
            strict=config["ANTHROPIC_STRICT"],
        )
    if run.provider == "external":
        return ExternalProvider()
    raise ValueError(f"unknown provider {run.provider!r}")


class ExternalProvider:
    """An external run's turns come from its agent through the API, never from a request of
    ours; asking for one is a mistake the runtime reports like any provider failure."""

    name = "external"

    def next_turn(self, request):
        raise ProviderRequestError("an external run's model turns come from its agent (the API)")
