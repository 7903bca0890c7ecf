"""What every admin page shares: where the job rows live, the queue objects, decoding and
permission names.

The admin reads rows from one database alias: the backend's own tables with the database
backend, the model mirror with Redis. Live figures (counts, paused, workers) come from the
storage through the Queue API, which is both cheaper and fresher than the mirror on Redis.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Sequence
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.template.loader import render_to_string
from django.utils import timezone

from .. import permissions as ops
from ..backend import get_storage
from ..conf import jobq_settings
from ..permissions import PERMISSIONS
from ..queue.core import Queue, get_queue
from ..queue.sharding import collapse, members
from ..serde import serde_for
from ..validation import validate_physical_queue_name

logger = logging.getLogger("django_jobq.admin")

#: Who may change what a job does next: the same map the REST API asks (permissions.py).
CANCEL_PERM = PERMISSIONS[ops.CANCEL]
RETRY_PERM = PERMISSIONS[ops.RETRY]
CHANGE_PERM = PERMISSIONS[ops.CHANGE]
DELETE_PERM = PERMISSIONS[ops.DELETE]
QUEUE_CHANGE_PERM = PERMISSIONS[ops.PAUSE]


def jobs_alias() -> str:
    """The database alias holding the Job rows the admin lists."""
    conf = jobq_settings()
    if conf["BACKEND"] == "database":
        return str(conf["DATABASE_ALIAS"])
    return str(conf["MIRROR"]["DATABASE_ALIAS"])


def has_mirror() -> bool:
    """True when the rows are a read model of another storage (they may lag the truth)."""
    return jobq_settings()["BACKEND"] != "database"


def mirror_banner(queues: Sequence[str] | None = None) -> str | None:
    """The warning shown on the admin's pages while their rows may be out of date: the rows
    more than ``MIRROR["LAG_WARNING"]`` seconds behind Redis, a queue being re-read after
    the mirror lost events (until the re-read ends), accepted jobs Redis lost (for an hour),
    a queue shown as a sample, jobs the mirror set aside. ``queues`` (physical names) scopes
    it to a page's queues: a gap on one queue once warned on every job page of every queue
    for an hour after its rows were current again. None when the rows are current (or are
    the state: database backend)."""
    from ..mirror import check as mirror_check
    from ..models import MirrorReject

    if not has_mirror():
        return None
    conf = jobq_settings()["MIRROR"]
    try:
        storage = get_storage()
        known = physical_queue_names()  # a name from a URL never reaches a Redis key
        scope = known if queues is None else [q for q in queues if q in set(known)]
        lag, backlog = mirror_check.lag(storage, scope)
        rejects = MirrorReject.objects.using(jobs_alias())
        if queues is not None:
            rejects = rejects.filter(queue__in=scope)
        rejected = rejects.count() if lag is not None else 0
        gaps = mirror_check.recent_gaps(storage, scope) if lag is not None else []
        sampled = mirror_check.sampled_queues(storage, scope) if lag is not None else []
    except Exception as exc:  # Redis down: the pages say so where they read it
        logger.warning("mirror lag not readable: %s", exc)
        return None
    parts = []
    if lag is not None and lag > conf["LAG_WARNING"]:
        parts.append(
            f"The job rows are {duration(lag * 1000)} behind Redis ({backlog} events not "
            "written yet): lists and history may be out of date; live counts and job states "
            "come from Redis."
        )
    healing = [g for g in gaps if g.get("healing")]
    if healing:
        names = ", ".join(sorted({str(g["queue"]) for g in healing}))
        parts.append(
            f"The mirror lost events before writing them and is re-reading {names} from "
            f"Redis ({healing[0]['why']}): its rows may be out of date until that ends; "
            "live counts and job states come from Redis."
        )
    lost = [g for g in gaps if isinstance(g.get("lost"), int) and g["lost"] > 0]
    if lost:
        said = ", ".join(f"{g['lost']:,} of {g['queue']}" for g in lost)
        parts.append(
            f"Accepted jobs are gone from Redis before they finished ({lost[0]['why']}): "
            f"{said}. Their rows are marked Lost (filter by state); nothing will run them. "
            "durability='journal' would have re-created them (docs/durability.md)."
        )
    for mode in sampled:
        since = dt.datetime.fromtimestamp(mode["since"], tz=dt.UTC)
        counts = ", ".join(f"{n} {state}" for state, n in mode["counts"].items() if n)
        parts.append(
            f"The mirror shows counts and a sample for queue {mode['queue']} since "
            f"{since:%Y-%m-%d %H:%M:%S} UTC ({mode['why']}): its rows are a sample of its "
            f"jobs, not all of them; Redis counts {counts or 'no jobs'}."
        )
    if rejected:
        parts.append(f"{rejected} jobs could not be written to the rows (see Mirror rejects).")
    return " ".join(parts) or None


def queue_for(name: str) -> Queue:
    """The Queue API object for a queue name taken from a URL or a row (validated first; a
    row of a sharded queue names its partition, which is then acted on directly)."""
    return get_queue(validate_physical_queue_name(name))


def rows_of(name: str) -> list[str]:
    """The physical queues whose rows belong to queue ``name`` (a sharded queue: all its
    partitions, old ones included)."""
    return members(name, physical_queue_names()) or [name]


def queue_names() -> list[str]:
    """Every queue as users name it: a sharded queue's partitions appear as their logical
    queue (``sharding.collapse``). What rows are filtered by is ``physical_queue_names``."""
    return collapse(physical_queue_names())


def physical_queue_names() -> list[str]:
    """Every queue the storage knows, plus configured ones that saw no job yet. With the
    storage unreachable, the configured and recorded ones: the pages still open and show
    the error where live figures were asked for."""
    from ..models import QueueConfig

    names: set[str] = set()
    try:
        names.update(get_storage().list_queues())
    except Exception as exc:  # Redis down: any client error; the rows can still be listed
        logger.warning("queue registry not readable: %s", exc)
    names.update(jobq_settings()["QUEUES"])
    names.update(QueueConfig.objects.using(jobs_alias()).values_list("name", flat=True))
    return sorted(names)


def decode_blob(raw: Any, content_type: str) -> Any:
    """A payload or result as Python data; bytes that no longer decode are shown raw rather
    than hiding the job."""
    if raw is None:
        return None
    data = bytes(raw)
    if not data:
        return None
    try:
        return serde_for(content_type).loads(data)
    except Exception:  # any decoder error: show the bytes instead
        return data


def pretty(value: Any) -> str:
    """Readable JSON for payloads, results, progress; raw bytes as their repr."""
    if isinstance(value, bytes | bytearray | memoryview):
        return repr(bytes(value))
    try:
        return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def age(since: dt.datetime | None, now: dt.datetime | None = None) -> str:
    """A duration as the few units an operator reads at a glance (``3m 12s``)."""
    if since is None:
        return "—"
    seconds = max(0, int(((now or timezone.now()) - since).total_seconds()))
    return duration(seconds * 1000)


def duration(ms: float | None) -> str:
    if ms is None:
        return "—"
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = int(ms // 1000)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    shown = [f"{n}{unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0s"


#: How often the overview and the workers page poll their rows (seconds) unless the
#: page's ``?refresh=N`` asks for one of the offered periods.
LIVE_EVERY = 5


def live_rows(
    request: HttpRequest, parts: dict[str, str], context: dict[str, Any]
) -> JsonResponse | None:
    """The answer to a page's own poll (``?live=1``): its table rows rendered by the partial
    templates the page includes, by element id, for jobq-live.js to put in place. Rendering
    the same partials keeps the polled rows identical to a reload (escaping, links, CSRF
    tokens of the row forms); None when the request is not a poll."""
    if request.GET.get("live") != "1":
        return None
    query = request.GET.copy()
    query.pop("live")
    # Row forms (Pause) send the operator back to the page, not to its poll.
    page = request.path + (f"?{query.urlencode()}" if query else "")
    context = {**context, "page_path": page}
    html = {eid: render_to_string(name, context, request=request) for eid, name in parts.items()}
    return JsonResponse({"html": html}, headers={"Cache-Control": "no-store"})
