"""``path("metrics/", include("django_jobq.metrics.urls"))``: the Prometheus scrape target."""

from django.urls import path

from .views import metrics_view

urlpatterns = [path("", metrics_view, name="jobq-metrics")]
