from django.contrib import admin
from django.urls import include, path

from django_jobq.admin.apidocs import JobqRedocView, JobqSwaggerView

from . import asgi_views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("jobq/docs/", JobqSwaggerView.as_view(url_name="jobq-api:schema"), name="jobq-docs"),
    path("jobq/redoc/", JobqRedocView.as_view(url_name="jobq-api:schema"), name="jobq-redoc"),
    path("jobq/", include("django_jobq.api.urls")),
]
urlpatterns.append(path("metrics/", include("django_jobq.observability.metrics.urls")))
# tests/test_async_producers.py: async views under a real ASGI server.
urlpatterns += [
    path("async/add/<int:a>/<int:b>/", asgi_views.add_and_wait),
    path("async/enqueue/<str:job_id>/", asgi_views.enqueue_only),
]
