"""Queue controls from the admin: pause or resume every queue at once, and edit one queue's
limits and retention from its page.

Every change goes through the Queue API (``Queue.pause``, ``set_limits``, ``set_retention``:
the same validation as ``manage.py jobq_queue``), needs the queue change permission, and is
written to the admin's history (``LogEntry`` on the queue, by name: with Redis there may be no
``QueueConfig`` row to attach it to).
"""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from ..conf import configured_limits, configured_retention
from ..errors import ValidationError as RefusedInput
from ..job import Keep, QueueLimits
from ..models import QueueConfig
from .common import QUEUE_CHANGE_PERM, queue_for, queue_names

#: Fields of the limits form: (name, label, what a blank means). Windows are in seconds
#: here (ms in the Queue API): an operator thinks "100 per minute", not "per 60000".
LIMIT_FIELDS = (
    ("concurrency", "Concurrency", "jobs of the queue running at once, across all workers"),
    ("rate_max", "Rate: jobs", "jobs that may start within the rate window"),
    ("rate_window", "Rate: window (s)", "seconds"),
    ("group_rate_max", "Group rate: jobs", "jobs of one group key within the group window"),
    ("group_rate_window", "Group rate: window (s)", "seconds"),
)
WINDOWS = {"rate_window", "group_rate_window"}
STATES = ("completed", "failed", "cancelled")
MAX_INT = 2**31 - 1  # what the database backend's columns hold


def audit(request: HttpRequest, name: str, message: str) -> None:
    """Who changed which queue, in the admin's history."""
    LogEntry.objects.create(
        user_id=cast(Any, request.user.pk),  # logged in: admin_view
        content_type=ContentType.objects.get_for_model(QueueConfig),
        object_id=name,
        object_repr=f"queue {name}"[:200],
        action_flag=CHANGE,
        change_message=message,
    )


class SettingsForm(forms.Form):
    """A queue's limits and retention; a blank field means "no limit" / "keep until the
    result TTL"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, label, help_text in LIMIT_FIELDS:
            self.fields[name] = forms.IntegerField(
                label=label, required=False, min_value=1, max_value=MAX_INT,
                help_text=f"{help_text}; blank: no limit",
            )  # fmt: skip
        for state in STATES:
            self.fields[f"{state}_count"] = forms.IntegerField(
                label=f"Keep {state}: newest", required=False, min_value=0, max_value=MAX_INT,
                help_text="records; blank: no bound",
            )  # fmt: skip
            self.fields[f"{state}_age"] = forms.IntegerField(
                label=f"Keep {state}: for (s)", required=False, min_value=1,
                max_value=10 * 365 * 86_400, help_text="seconds after finishing; blank: no bound",
            )  # fmt: skip

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for rate, window in (("rate_max", "rate_window"), ("group_rate_max", "group_rate_window")):
            if (data.get(rate) is None) != (data.get(window) is None):
                raise forms.ValidationError(
                    f"{self.fields[rate].label} and {self.fields[window].label} go together: "
                    "give both or neither."
                )
        return data

    def limits(self) -> dict[str, int | None]:
        data = self.cleaned_data
        return {
            name: (data[name] * 1000 if name in WINDOWS and data[name] is not None else data[name])
            for name, _, _ in LIMIT_FIELDS
        }

    def retention(self) -> dict[str, dict[str, int]]:
        out = {}
        for state in STATES:
            count, age = self.cleaned_data[f"{state}_count"], self.cleaned_data[f"{state}_age"]
            keep = {
                k: v for k, v in (("count", count), ("age", age and age * 1000)) if v is not None
            }
            if keep:
                out[state] = keep
        return out


def initial(limits: QueueLimits, retention: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, _, _ in LIMIT_FIELDS:
        value = getattr(limits, name)
        values[name] = value // 1000 if name in WINDOWS and value is not None else value
    for state, keep in retention.items():
        if isinstance(keep, Keep):
            values[f"{state}_count"] = keep.count
            values[f"{state}_age"] = None if keep.age is None else keep.age // 1000
    return values


def settings_view(admin: Any, request: HttpRequest, name: str) -> HttpResponse:
    """The queue's limits and retention, as a form; saved, they hold for every worker at once
    (until a worker starts with other values in ``JOBQ["QUEUES"]``, which the page says)."""
    if not request.user.has_perm(QUEUE_CHANGE_PERM):
        raise PermissionDenied
    if name not in queue_names():
        raise Http404(f"No queue {name!r}.")
    queue = queue_for(name)
    error = None
    if request.method == "POST":
        form = SettingsForm(request.POST)
        if form.is_valid():
            try:
                queue.set_limits(**form.limits())
                queue.set_retention(form.retention() or None)
            except RefusedInput as exc:
                error = str(exc)
            else:
                said = _describe(form.limits(), form.retention())
                audit(request, name, f"Limits and retention set: {said}")
                admin.message_user(request, f"Queue {name}: {said}.", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:django_jobq_queue_detail", args=[name]))
    else:
        form = SettingsForm(initial=initial(queue.get_limits(), queue.get_retention()))
    context = {
        **admin.admin_site.each_context(request),
        "title": f"Limits and retention of queue {name}",
        "opts": admin.model._meta,
        "queue_name": name,
        "form": form,
        "error": error,
        "configured": bool(configured_limits(name) or configured_retention(name)),
    }
    return TemplateResponse(request, "admin/django_jobq/queues/settings.html", context)


def _describe(limits: dict[str, int | None], retention: dict[str, dict[str, int]]) -> str:
    shown = [f"{k}={v}" for k, v in limits.items() if v is not None]
    shown += [f"keep {s} {keep}" for s, keep in retention.items()]
    return ", ".join(shown) or "no limits, no retention"


def pause_all_view(admin: Any, request: HttpRequest, verb: str) -> HttpResponse:
    """Pause (or resume) every queue: a confirmation with their number, then each queue in
    turn through the Queue API; a queue that refuses is named, the others go on."""
    if not request.user.has_perm(QUEUE_CHANGE_PERM):
        raise PermissionDenied
    names = queue_names()
    if request.method != "POST" or request.POST.get("confirm") != "yes":
        context = {
            **admin.admin_site.each_context(request),
            "title": f"{verb.capitalize()} every queue",
            "opts": admin.model._meta,
            "verb": verb,
            "names": names,
        }
        return TemplateResponse(request, "admin/django_jobq/queues/pause_all.html", context)
    failed = []
    for name in names:
        try:
            queue = queue_for(name)
            queue.pause() if verb == "pause" else queue.resume()
        except Exception as exc:  # one queue's refusal or a storage error: name it, go on
            failed.append(f"{name} ({type(exc).__name__}: {exc})")
        else:
            audit(request, name, f"{'Paused' if verb == 'pause' else 'Resumed'} (all queues)")
    done = len(names) - len(failed)
    text = f"{'Paused' if verb == 'pause' else 'Resumed'} {done} of {len(names)} queue(s)."
    if failed:
        admin.message_user(request, f"{text} Not done: {'; '.join(failed)}", messages.WARNING)
    else:
        admin.message_user(request, text, messages.SUCCESS)
    return HttpResponseRedirect(reverse("admin:django_jobq_queueconfig_changelist"))
