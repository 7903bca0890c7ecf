from django.apps import AppConfig


class MirrorBenchConfig(AppConfig):
    name = "bench.mirrorapp"
    label = "jobq_mirror_bench"
