"""Model providers: `scripted` (offline, the default) and `anthropic` (the real Messages API)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from django.conf import settings

from agents.models import RunScript
from agents.providers.base import Provider, ProviderRequestError
from agents.providers.scripted import ScriptedProvider

# A run's script never changes (create_run writes it once), so a worker keeps the providers of
# the runs it drove lately: a new slice (after a handoff, say) does not read and parse the whole
# script again (~1.2 MB of JSON for 10,000 turns). Keyed by the run's creation time as well, as
# SQLite may give a deleted run's id to a new one.
_scripted: OrderedDict[tuple[int, Any], ScriptedProvider] = OrderedDict()
_SCRIPTED_KEPT = 32
_scripted_lock = threading.Lock()


def _scripted_provider(run) -> ScriptedProvider:
    key = (run.pk, run.created_at)
    with _scripted_lock:
        provider = _scripted.get(key)
        if provider is not None:
            _scripted.move_to_end(key)
            return provider
    script = RunScript.objects.filter(run_id=run.pk).values_list("script", flat=True).first()
    if script is None:
        raise ValueError(f"run {run.pk} is scripted but has no script")
    provider = ScriptedProvider(script, validated=True)
    with _scripted_lock:
        _scripted[key] = provider
        while len(_scripted) > _SCRIPTED_KEPT:
            _scripted.popitem(last=False)
    return provider


def for_run(run) -> Provider:
    if run.provider == "scripted":
        return _scripted_provider(run)
    if run.provider == "anthropic":
        # Deferred: the SDK takes about a second to import; only workers driving such runs pay.
        # It is the claude extra: without it such a run fails saying so.
        try:
            from agents.providers.anthropic import AnthropicProvider  # noqa: PLC0415
        except ModuleNotFoundError as e:
            if e.name != "anthropic":
                raise
            raise ValueError(
                "runs driven by Claude need the claude extra: pip install 'shiftlog[claude]'"
            ) from None

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
