"""``manage.py check`` reports a bad JOBQ setting before any worker starts."""

from django.core import checks

from .conf import check_settings


@checks.register()
def jobq_settings_check(app_configs, **kwargs):
    return [
        checks.Error(problem, hint="See docs/settings.md.", id="django_jobq.E001")
        for problem in check_settings()
    ]
