from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("jobq/", include("django_jobq.api.urls")),
]
urlpatterns.append(path("metrics/", include("django_jobq.metrics.urls")))
