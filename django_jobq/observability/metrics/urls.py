"""The Prometheus scrape target:
``path("metrics/", include("django_jobq.observability.metrics.urls"))``."""

from django.urls import path

from .views import metrics_view

urlpatterns = [path("", metrics_view, name="jobq-metrics")]
