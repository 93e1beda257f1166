from __future__ import annotations

from django.conf import settings
from django.core.management.base import CommandError
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

from agents import inputs, telemetry
from agents.management.base import BaseCommand, fail, get_run, id_arg


class Command(BaseCommand):
    help = (
        "Export a run as an OpenTelemetry trace, built from its event log: to the collector "
        "OTEL_EXPORTER_OTLP_ENDPOINT names, to another with --endpoint URL (OTLP over HTTP), or "
        "as JSON on standard output with --console. Exporting a run again makes the same trace."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=id_arg, metavar="RUN")
        where = parser.add_mutually_exclusive_group()
        where.add_argument(
            "--endpoint",
            metavar="URL",
            help="the collector's base URL (http://host:4318) or its /v1/traces URL",
        )
        where.add_argument(
            "--console", action="store_true", help="print the spans as JSON instead of sending"
        )
        parser.add_argument(
            "--content",
            action="store_true",
            help="with the model's and tools' content on the spans, cut and redacted, as "
            "SHIFTLOG_OTEL_CONTENT=1 does (default: that setting)",
        )

    def handle(self, *args, **o):
        run = get_run(o["run_id"])
        content = True if o["content"] else None
        if o["console"]:
            telemetry.export(run.pk, ConsoleSpanExporter(out=self.stdout), with_content=content)
            return
        endpoint = o["endpoint"]
        if endpoint is not None:
            try:
                endpoint = inputs.http_url(endpoint, what="--endpoint")
            except inputs.InputError as e:
                raise fail(str(e)) from None
        elif not settings.SHIFTLOG["OTEL_ENDPOINT"]:
            raise fail(
                "no collector to send to: set OTEL_EXPORTER_OTLP_ENDPOINT, give --endpoint URL, "
                "or print the trace with --console"
            )
        exporter = telemetry.otlp_exporter(endpoint)
        try:
            sent = telemetry.export(run.pk, exporter, with_content=content)
        finally:
            exporter.shutdown()
        url = telemetry.traces_url(endpoint or settings.SHIFTLOG["OTEL_ENDPOINT"])
        if sent is None:
            raise CommandError(f"the collector at {url} did not take the trace of run {run.pk}")
        self.stdout.write(f"exported run {run.pk} to {url}: {sent} spans")
