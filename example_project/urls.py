from django.contrib import admin
from django.urls import include, path

from django_jobq.admin.apidocs import JobqRedocView, JobqSwaggerView
from example_project.demo import views

SCHEMA = "jobq-api:schema"

urlpatterns = [
    path("", views.home, name="home"),
    path("admin/", admin.site.urls),
    # Pages that render the API's own schema (logged out, they send you to the admin's login).
    path("jobq/docs/", JobqSwaggerView.as_view(url_name=SCHEMA), name="jobq-docs"),
    path("jobq/redoc/", JobqRedocView.as_view(url_name=SCHEMA), name="jobq-redoc"),
    path("jobq/", include("django_jobq.api.urls")),
]
