"""The job form and what fills it: a new job's fields checked by ``Queue.build``, the same
check the REST API's enqueue ends with (ids, queue names, options, the payload's
serialisation and size), and a job's settings read back for a copy."""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

from django import forms
from django.utils import timezone

from ...errors import InvalidJobId, InvalidQueueName, PayloadTooLarge
from ...errors import ValidationError as RefusedInput
from ...models import Job
from ...queue.core import get_queue
from ...serde import serde_for, unwrap
from ...states import JobState
from ...tasks.registry import handler_name, registry
from ...validation import MAX_DURATION_MS, PRIORITY_RANGE, logical_name, validate_queue_name
from ..common import queue_for, queue_names

#: Options a copy keeps from its job (``Job`` columns, passed to ``Queue.enqueue`` as named).
COPIED = ("priority", "max_attempts", "max_stalls", "min_backoff", "max_backoff", "result_ttl")
#: Envelope settings a copy keeps; flow links and trace context belong to the first run only.
COPIED_META = ("timeout", "hard_timeout")
#: The form's fields the Queue API's refusals are matched to (first named in the message).
FIELDS = (
    "job_id",
    "payload",
    "priority",
    "max_attempts",
    "max_stalls",
    "min_backoff",
    "max_backoff",
    "result_ttl",
    "delay",
    "run_at",
    "group",
    "timeout",
    "hard_timeout",
)
LOCAL_FORMAT = "%Y-%m-%dT%H:%M:%S"
MAX_SECONDS = MAX_DURATION_MS // 1000


def _ms(label: str) -> forms.IntegerField:
    return forms.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_DURATION_MS,
        label=label,
        help_text="ms; blank: the queue's default",
    )


def _when() -> forms.DateTimeField:
    return forms.DateTimeField(
        required=False,
        label="Run at",
        input_formats=[LOCAL_FORMAT, "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"],
        widget=forms.DateTimeInput(
            attrs={"type": "datetime-local", "step": "1"}, format=LOCAL_FORMAT
        ),
    )


class _StrictJSON(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _StrictJSON(f"{name} is not JSON (the API refuses it too)")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _StrictJSON(f"{text[:40]} is too big for a float (not storable)")
    return number


def parse_payload(text: str) -> Any:
    """The payload text as data, strictly: NaN and infinities are refused (JSON has no
    spelling for them; Python's reader accepts them), so are numbers too big for a float."""
    if not text.strip():
        return None
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except _StrictJSON as exc:
        raise forms.ValidationError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise forms.ValidationError(
            f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise forms.ValidationError("Not storable: nested too deeply.") from None


class JobForm(forms.Form):
    """A new job: where, what, and the options an operator is most likely to change. Every
    field but the queue is optional; blank means what the queue's own settings say."""

    queue = forms.CharField(
        max_length=64, widget=forms.TextInput(attrs={"list": "jobq-queue-names"})
    )
    new_queue = forms.BooleanField(required=False, label="Create this queue")
    job_id = forms.CharField(
        required=False,
        max_length=128,
        label="Job id",
        help_text="Blank: a fresh id. An id that exists already is not enqueued again.",
    )
    handler = forms.CharField(
        required=False,
        max_length=200,
        widget=forms.TextInput(attrs={"list": "jobq-task-names", "class": "vTextField"}),
        help_text="Blank or the queue's handler: a plain job; a task name: that task's job.",
    )
    payload = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 12, "class": "jobq-code"}),
        help_text="JSON; blank: null.",
    )
    priority = forms.IntegerField(
        required=False,
        min_value=PRIORITY_RANGE[0],
        max_value=PRIORITY_RANGE[1],
        help_text="lower runs first",
    )
    max_attempts = forms.IntegerField(required=False, min_value=1, max_value=1_000_000)
    run_at = _when()
    delay = forms.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_SECONDS,
        help_text="seconds from now (or a time above, not both)",
    )
    max_stalls = forms.IntegerField(required=False, min_value=0, max_value=1_000_000)
    min_backoff = _ms("Min backoff")
    max_backoff = _ms("Max backoff")
    result_ttl = _ms("Result TTL")
    group = forms.CharField(required=False, max_length=128, label="Rate group")
    lifo = forms.BooleanField(required=False, label="LIFO")
    timeout = forms.FloatField(
        required=False, min_value=0.001, max_value=86400, help_text="seconds (soft)"
    )
    hard_timeout = forms.FloatField(
        required=False, min_value=0.001, max_value=86400, help_text="seconds"
    )

    #: The fields under "More options": kept from a copied job, rarely changed by hand.
    MORE = ("max_stalls", "min_backoff", "max_backoff", "result_ttl", "group", "lifo",
            "timeout", "hard_timeout")  # fmt: skip
    #: Set when the queue named is not known yet: the page then offers "Create this queue".
    offer_new_queue = False

    def more(self) -> list[forms.BoundField]:
        return [self[name] for name in self.MORE]

    def clean_queue(self) -> str:
        try:
            return validate_queue_name(self.cleaned_data["queue"])
        except InvalidQueueName as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_payload(self) -> Any:
        return parse_payload(self.cleaned_data.get("payload") or "")

    def clean_run_at(self) -> dt.datetime | None:
        when = self.cleaned_data.get("run_at")
        return None if when is None else bounded_time(when)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        queue = data.get("queue")
        if self.errors or queue is None:
            return data
        if queue not in queue_names() and not data.get("new_queue"):
            self.add_error(
                "queue",
                f"There is no queue {queue!r} yet: tick “Create this "
                "queue” to enqueue into a new one (a typo would create it too).",
            )
            self.offer_new_queue = True
            return data
        if data.get("run_at") is not None and data.get("delay") is not None:
            self.add_error("delay", "Give a time to run at or a delay, not both.")
            return data
        try:
            data["spec"] = spec = self._spec(data)
            get_queue(queue).build(spec["job_id"], spec["payload"], **spec["options"])
        except forms.ValidationError as exc:
            self.add_error("handler", exc)
        except (InvalidJobId, InvalidQueueName, PayloadTooLarge, RefusedInput) as exc:
            self.add_error(_field_of(exc), str(exc))
        except Exception as exc:  # a queue the settings make unusable (journal without Redis)
            self.add_error(None, f"{type(exc).__name__}: {exc}")
        return data

    def _spec(self, data: dict[str, Any]) -> dict[str, Any]:
        options = {k: data[k] for k in COPIED if data.get(k) is not None}
        options.update({k: data[k] for k in COPIED_META if data.get(k) is not None})
        if data.get("group"):
            options["group"] = data["group"]
        if data.get("lifo"):
            options["lifo"] = True
        if data.get("run_at") is not None:
            options["run_at"] = data["run_at"]
        elif data.get("delay"):
            options["delay"] = data["delay"] * 1000
        meta = handler_meta(data["queue"], data.get("handler") or "")
        if meta:
            options["meta"] = meta
        return {
            "job_id": data.get("job_id") or None,
            "payload": data.get("payload"),
            "options": options,
        }


def bounded_time(when: dt.datetime) -> dt.datetime:
    """A due time an operator typed, within what every backend stores: at most ten years
    ahead (past: run now). Far years would read as a flow parent's parking (year 9000)."""
    now = timezone.now()
    try:
        too_late = when - now > dt.timedelta(milliseconds=MAX_DURATION_MS)
        when.timestamp()
    except (OverflowError, ValueError):
        raise forms.ValidationError("Not a time this server can store.") from None
    if too_late:
        raise forms.ValidationError("At most ten years from now.")
    return when


def handler_meta(queue: str, name: str) -> dict[str, Any]:
    """Envelope meta for the handler field: {} for the queue's own handler, the task's name for
    a registered task (``tasks/core.py``); anything else would fail on the worker."""
    name = name.strip()
    if not name or name == handler_name(queue):
        return {}
    if registry.task(name) is not None:
        return {"task": name}
    own = handler_name(queue) or "none registered here"
    raise forms.ValidationError(
        f"No handler {name!r}: neither queue {queue}'s handler ({own}) nor a registered task."
    )


def _field_of(exc: Exception) -> str | None:
    if isinstance(exc, InvalidJobId):
        return "job_id"
    if isinstance(exc, InvalidQueueName):
        return "queue"
    text = str(exc)
    if isinstance(exc, PayloadTooLarge) or "serialis" in text or "payload" in text:
        return "payload"
    named = [f for f in FIELDS if f in text]
    return max(named, key=len) if named else None  # "max_attempts" over "attempts"


# -- a job's settings, for a copy ------------------------------------------------------------


def job_copy(job: Job) -> dict[str, Any]:
    """What a new job made from ``job`` gets: its logical queue (a sharded queue routes the
    copy by its own id), payload, handler and options (from the row, and from the storage's
    status where the row may not have them). Raises ``ValueError`` when the stored payload no
    longer decodes."""
    try:
        status = queue_for(job.queue).get_status(job.job_id)
    except Exception:  # storage unreachable or a reserved row: the row alone
        status = None
    try:
        value = serde_for(job.content_type).loads(bytes(job.payload)) if job.payload else None
    except Exception:  # any decoder's error, or a content type no serde here reads
        raise ValueError("its payload no longer decodes") from None
    payload, meta = unwrap(job.content_type, value)
    queue = logical_name(job.queue)
    options: dict[str, Any] = {k: getattr(job, k) for k in COPIED}
    options.update({k: meta[k] for k in COPIED_META if k in meta})
    group, lifo = job.group, job.lifo
    if status is not None:  # the storage's record: the Redis mirror's rows lack these two
        group, lifo = status.group or "", status.lifo
    if group:
        options["group"] = group
    if lifo:
        options["lifo"] = True
    task = meta.get("task") if isinstance(meta.get("task"), str) else None
    return {"queue": queue, "payload": payload, "task": task, "options": options}


def initial_from(job: Job) -> dict[str, Any]:
    """The form's fields filled from ``job`` (the payload pretty-printed, in its own key order)."""
    copy = job_copy(job)
    initial = {
        "queue": copy["queue"],
        "handler": copy["task"] or handler_name(copy["queue"]),
        **copy["options"],
    }
    try:
        initial["payload"] = json.dumps(copy["payload"], indent=2, ensure_ascii=False)
    except (TypeError, ValueError):  # msgpack bytes: not JSON
        raise ValueError("its payload is not JSON (copy it with Run again)") from None
    if job.state in (JobState.SCHEDULED, JobState.RETRYING) and job.run_at:
        if job.run_at > timezone.now() and job.run_at.year < 9000:  # not a parked flow parent
            initial["run_at"] = timezone.localtime(job.run_at).strftime(LOCAL_FORMAT)
    return initial


class RescheduleForm(forms.Form):
    run_at = _when()

    def clean_run_at(self) -> dt.datetime:
        when = self.cleaned_data.get("run_at")
        if when is None:
            raise forms.ValidationError("Give the time to run at.")
        return bounded_time(when)
