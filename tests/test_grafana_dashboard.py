"""docs/grafana/django-jobq.json queries only metrics that django-jobq serves: every ``jobq_*``
name in its expressions must appear in a real exposition (the metrics view with the Redis
backend and its mirror, this process's counters, and a worker endpoint's gauges)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from django_jobq.observability.metrics import tally
from django_jobq.observability.metrics.collectors import WorkerCollector
from django_jobq.observability.metrics.views import exposition
from django_jobq.queue import Queue
from django_jobq.tasks.registry import HandlerRegistry
from django_jobq.worker import Worker

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "django-jobq.json"
SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"],
            "gauge": [""]}  # fmt: skip


def queried(dashboard: dict) -> set[str]:
    """Every jobq_* metric name in the dashboard's panel and variable queries."""
    texts = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    texts += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return {name for text in texts for name in re.findall(r"\bjobq_[a-z_]+\b", text)}


def served(text: str) -> set[str]:
    """Sample names an exposition declares, from each family's type (present even before
    the first sample of a counter)."""
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in SUFFIXES.get(family.type, [""])
    }


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_every_metric_the_dashboard_queries_is_served(settings, redis_prefix):
    settings.JOBQ = {**django_settings.JOBQ, "PREFIX": redis_prefix, "MIRROR": {"ENABLED": True}}
    Queue("dash").enqueue("one", 1)
    tally.uninstall()
    tally.install()
    try:
        view = exposition().decode()
    finally:
        tally.uninstall()
    worker = Worker(["dash"], handlers=HandlerRegistry(), worker_id="dash-worker")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(worker))
    names = served(view) | served(generate_latest(registry).decode())
    dashboard = json.loads(DASHBOARD.read_text())
    wanted = queried(dashboard)
    assert len(wanted) >= 15  # the parser found the queries
    assert wanted - names == set()


def test_the_dashboard_is_importable_json_with_unique_panel_ids():
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "queue"}
    for panel in dashboard["panels"]:
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
