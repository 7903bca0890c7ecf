from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerView

from example_project.demo import views

SCHEMA = "jobq-api:schema"

urlpatterns = [
    path("", views.home, name="home"),
    path("admin/", admin.site.urls),
    path("jobq/", include("django_jobq.api.urls")),
    # Pages that render the API's own schema (log in through /admin/ first: it is authenticated).
    path("jobq/docs/", SpectacularSwaggerView.as_view(url_name=SCHEMA), name="jobq-docs"),
    path("jobq/redoc/", SpectacularRedocView.as_view(url_name=SCHEMA), name="jobq-redoc"),
]
