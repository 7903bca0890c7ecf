"""App config of the benchmark's handler app (a label that cannot clash with a project's)."""

from django.apps import AppConfig


class BenchAppConfig(AppConfig):
    name = "bench.benchapp"
    label = "jobq_bench"
