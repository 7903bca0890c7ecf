"""The job list on big tables (issue 37), through Django's test client on SQLite and
PostgreSQL (database backend): deep pages of a filtered list keep their filter, the sort by
finish time, and the search by handler, in payloads and in errors, hostile terms included.

Big tables are stood in for by a small count cap and small pages (``COUNT_CAP``,
``list_per_page``): the paths taken are those of a million rows."""

from __future__ import annotations

import datetime as dt
import io
import json
import re

import msgpack
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from django_jobq.admin import listing, search
from django_jobq.admin.jobs import JobAdmin
from django_jobq.backend import get_storage
from django_jobq.models import Job

Q = "list-tests"
LIST = reverse("admin:django_jobq_job_changelist")
pytestmark = pytest.mark.django_db(databases=["default", "pg"], transaction=True)


@pytest.fixture(params=["default", pytest.param("pg", marks=pytest.mark.postgres)])
def alias(request, settings) -> str:
    """The database the job rows (and the database backend) live in: SQLite or PostgreSQL."""
    settings.JOBQ = {**settings.JOBQ, "BACKEND": "database", "DATABASE_ALIAS": request.param}
    get_storage().register_queue(Q)
    return request.param


@pytest.fixture
def small_pages(monkeypatch) -> None:
    """Two rows a page, counted up to 5: a capped count from the sixth matching row on."""
    monkeypatch.setattr(JobAdmin, "list_per_page", 2)
    monkeypatch.setattr(listing, "COUNT_CAP", 5)


def add(alias: str, prefix: str, count: int, *, state: str = "completed", **fields) -> None:
    """``count`` jobs named ``prefix-0`` (the newest) to ``prefix-<count-1>``, a second
    apart; finished a minute after creation when the state is a finished one."""
    now = timezone.now()
    finished = state in ("completed", "failed", "cancelled")
    late = dt.timedelta(minutes=1)
    Job.objects.using(alias).bulk_create(
        Job(
            queue=Q, job_id=f"{prefix}-{i}", state=state, handler="app.tasks.send",
            created_at=now - dt.timedelta(seconds=i),
            finished_at=now - dt.timedelta(seconds=i) + late if finished else None,
            **fields,
        )
        for i in range(count)
    )  # fmt: skip


def ids(page) -> list[str]:
    assert page.status_code == 200, page.content[:300]
    return [job.job_id for job in page.context["cl"].result_list]


# -- deep pages keep their filter (defect 3) --------------------------------------------------


def test_a_deep_page_of_a_filtered_list_keeps_its_filter_and_the_pager_goes_on(
    admin_client, alias, small_pages
):
    add(alias, "failed", 30, state="failed")
    add(alias, "done", 10)

    page = admin_client.get(LIST, {"state__exact": "failed", "p": 10})

    assert ids(page) == ["failed-18", "failed-19"]  # no redirect to ?e=1, the filter holds
    cl = page.context["cl"]
    assert cl.get_filters_params() == {"state__exact": ["failed"]}
    assert cl.count_text == "more than 5 jobs"
    html = page.content.decode()
    assert re.search(r'id="jobq-pager-count">more than 5 jobs<', html)  # as the header says
    assert ">6 jobs" not in html and ">10001" not in html
    shown = [item["number"] for item in cl.pager["items"] if item["number"]]
    assert shown == [1, 8, 9, 10, 11] and cl.pager["more"]
    assert "state__exact=failed" in cl.pager["next"] and "p=11" in cl.pager["next"]
    assert ids(admin_client.get(LIST + cl.pager["next"])) == ["failed-20", "failed-21"]


def test_a_page_past_the_end_is_empty_with_a_link_back_not_a_redirect(
    admin_client, alias, small_pages
):
    add(alias, "failed", 8, state="failed")

    page = admin_client.get(LIST, {"state__exact": "failed", "p": 500})

    assert ids(page) == []
    html = page.content.decode()
    assert "No jobs on this page" in html
    back = re.search(r'href="([^"]*)" id="jobq-back-to-first"', html)
    assert back and "state__exact=failed" in back.group(1) and "p=1" in back.group(1)
    assert page.context["cl"].pager["next"] is None


def test_a_page_past_the_end_of_an_exactly_counted_list_is_empty_too(
    admin_client, alias, small_pages
):
    add(alias, "failed", 3, state="failed")

    page = admin_client.get(LIST, {"state__exact": "failed", "p": 7})

    assert ids(page) == [] and b"No jobs on this page" in page.content
    assert [i["number"] for i in page.context["cl"].pager["items"] if i["number"]] == [1, 2, 7]


@pytest.mark.parametrize("number", ["0", "-3", "abc", "", str(10**30)])
def test_odd_page_numbers_answer_a_page_never_an_error(admin_client, alias, small_pages, number):
    add(alias, "failed", 8, state="failed")

    page = admin_client.get(LIST, {"state__exact": "failed", "p": number})

    expected = [] if number == str(10**30) else ["failed-0", "failed-1"]
    assert ids(page) == expected


def test_the_live_poll_of_a_deep_page_reads_that_page(admin_client, alias, small_pages):
    add(alias, "failed", 12, state="failed")
    page = admin_client.get(LIST, {"state__exact": "failed", "p": 4})
    poll = re.search(r'data-jobq-live="([^"]*)"', page.content.decode()).group(1)
    assert "p=4" in poll and "state__exact=failed" in poll


# -- the sort by finish time (defect 6) -------------------------------------------------------


@pytest.mark.parametrize("direction", ["asc", "desc"])
@pytest.mark.parametrize("narrowed", [{}, {"queue": Q}, {"state__exact": "completed"}])
def test_sorted_by_finish_time_finished_jobs_come_in_order_then_the_unfinished_newest_first(
    admin_client, alias, small_pages, direction, narrowed
):
    add(alias, "done", 5)
    add(alias, "waiting", 3, state="queued")
    finished = [f"done-{i}" for i in range(5)]  # done-0 finished last
    finished = finished if direction == "desc" else finished[::-1]
    unfinished = [] if "state__exact" in narrowed else ["waiting-0", "waiting-1", "waiting-2"]

    order = "-10" if direction == "desc" else "10"  # 10: the "finished" column
    seen = []
    for number in range(1, 6):
        seen += ids(admin_client.get(LIST, {**narrowed, "o": order, "p": number}))

    assert seen == finished + unfinished


# -- search by handler, in payloads and in errors ---------------------------------------------


def test_search_by_the_beginning_of_a_handler_name_takes_wildcards_literally(admin_client, alias):
    now = timezone.now()
    for job_id, handler in (("s", "app.tasks.send"), ("r", "app.tasks.render"), ("o", "app.x")):
        Job.objects.using(alias).create(queue=Q, job_id=job_id, handler=handler, created_at=now)

    def found(term: str) -> set[str]:
        return set(ids(admin_client.get(LIST, {"q": term})))

    assert found("app.tasks.re") == {"r"}
    assert found("app.tasks.") == {"s", "r"}
    assert found("app_tasks") == set() and found("app%") == set()


def payload_jobs(alias: str) -> None:
    now = timezone.now()
    payloads = {
        "ann": (b'{"email":"Ann@Example.com","n":1}', "json"),
        "bob": (msgpack.packb({"n": 0, "email": "bob@example.com"}), "msgpack"),
        "carol": (b"\xff\xfe\x00carol@example.com\x00", "json"),  # not UTF-8, NUL bytes
        "dir": (json.dumps({"path": "C:\\dir\\50%_off"}).encode(), "json"),
        "late": (b"x" * search.PAYLOAD_BYTES + b"late@example.com", "json"),
        "empty": (b"", "json"),  # SQLite's substr of an empty blob is NULL
    }
    Job.objects.using(alias).bulk_create(
        Job(queue=Q, job_id=k, payload=p, content_type=t, created_at=now)
        for k, (p, t) in payloads.items()
    )


def test_search_in_payloads_finds_json_msgpack_and_undecodable_bytes(admin_client, alias):
    payload_jobs(alias)

    def found(term: str) -> set[str]:
        return set(ids(admin_client.get(LIST, {"q": term, "in": "payload"})))

    assert found("ann@example") == {"ann"}  # letter case aside
    assert found("bob@example.com") == {"bob"}
    assert found("carol@") == {"carol"}
    assert found("@example.com") == {"ann", "bob", "carol"}  # past the bound: "late" is not
    assert found("C:\\\\dir\\\\50%_off") == {"dir"}  # as JSON writes it, wildcards literal
    assert found("50%_") == {"dir"} and found("5_%") == set()


def test_search_in_errors_reads_type_message_and_traceback(admin_client, alias):
    now = timezone.now()
    errors = {
        "key": {"type": "KeyError", "message": "missing 'user_id'", "traceback": "File h.py"},
        "other": {"type": "ValueError", "message": "userXid", "traceback": ""},
        "odd": ["not", "an", "object"],
    }
    Job.objects.using(alias).bulk_create(
        Job(queue=Q, job_id=k, state="failed", error=e, created_at=now) for k, e in errors.items()
    )
    Job.objects.using(alias).create(queue=Q, job_id="ok", created_at=now, payload=b"KeyError")

    def found(term: str) -> set[str]:
        return set(ids(admin_client.get(LIST, {"q": term, "in": "error"})))

    assert found("keyerror") == {"key"}
    assert found("user_id") == {"key"}  # "_" is no wildcard
    assert found("h.py") == {"key"} and found("Error") == {"key", "other"}


def test_without_the_index_only_the_newest_jobs_are_searched_and_the_page_says_so(
    admin_client, alias, monkeypatch
):
    monkeypatch.setattr(search, "SCAN_ROWS", 3)
    add(alias, "job", 5, payload=b'{"tag":"blue"}')

    page = admin_client.get(LIST, {"q": "blue", "in": "payload"})

    if alias == "pg":  # the payload's trigram index is the operator's choice
        assert ids(page) == ["job-0", "job-1", "job-2"]
        assert b"manage.py jobq_search_index creates it" in page.content
        search._indexes_present.clear()
        call_command("jobq_search_index", database="pg", stdout=io.StringIO())
        try:
            page = admin_client.get(LIST, {"q": "blue", "in": "payload"})
            assert len(ids(page)) == 5 and b"jobq-search-note" not in page.content
            short = admin_client.get(LIST, {"q": "bl", "in": "payload"})
            assert ids(short) == ["job-0", "job-1", "job-2"]
            assert b"without 3 letters or digits in a row" in short.content
        finally:
            call_command("jobq_search_index", database="pg", drop=True, stdout=io.StringIO())
            search._indexes_present.clear()
    else:
        assert ids(page) == ["job-0", "job-1", "job-2"]
        assert b"Searched the payloads of the newest 3 jobs of this list" in page.content


def test_the_search_choice_is_kept_by_the_pager_and_an_unknown_one_is_said(
    admin_client, alias, small_pages
):
    add(alias, "job", 6, payload=b'{"tag":"blue"}')

    page = admin_client.get(LIST, {"q": "blue", "in": "payload"})
    assert 'value="payload" selected' in page.content.decode()
    assert "in=payload" in page.context["cl"].pager["next"]

    odd = admin_client.get(LIST, {"q": "job-1", "in": "nowhere"})
    assert ids(odd) == ["job-1"] and "There is no “search in nowhere”" in odd.content.decode()


HOSTILE = st.one_of(
    st.sampled_from(["%", "_", "\\", "%%", "\\%", "'", '"', "\x00", "a\x00b", "x" * 5000]),
    st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=300),
)


@pytest.mark.parametrize("where", ["", "payload", "error"])
def test_hostile_search_terms_never_fail_the_page(alias, where):
    user = User.objects.create_superuser(f"h-{where or 'id'}", password="pw")
    client = Client()
    client.force_login(user)
    Job.objects.using(alias).create(
        queue=Q, job_id="j", payload=b"\x00\xff%_\\", error={"type": "E", "message": "%_\\"},
        state="failed", created_at=timezone.now(),
    )  # fmt: skip

    @hypothesis_settings(max_examples=40, deadline=None)
    @given(term=HOSTILE)
    def search_for(term: str) -> None:
        page = client.get(LIST, {"q": term, "in": where})
        assert page.status_code == 200

    search_for()


NEEDLES = st.text(alphabet=st.characters(exclude_categories=["Cs", "Cc"]), min_size=1, max_size=30)


@pytest.mark.parametrize("where", ["payload", "error"])
def test_any_text_put_in_a_payload_or_error_is_found_by_searching_it(alias, where):
    user = User.objects.create_superuser(f"n-{where}", password="pw")
    client = Client()
    client.force_login(user)
    rows = Job.objects.using(alias)

    @hypothesis_settings(
        max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    @given(needle=NEEDLES)
    def finds(needle: str) -> None:
        term, _ = search.clean_term(needle)
        if not term:
            return
        rows.filter(queue=Q).delete()
        text = f"<{term}>"
        fields = (
            {"payload": text.encode()}
            if where == "payload"
            else {"error": {"type": "E", "message": text}}
        )
        rows.create(queue=Q, job_id="hit", state="failed", created_at=timezone.now(), **fields)
        page = client.get(LIST, {"q": term, "in": where})
        assert page.status_code == 200
        assert [j.job_id for j in page.context["cl"].result_list] == ["hit"]

    finds()


def test_the_payload_index_command_says_it_is_for_postgresql_only():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="PostgreSQL"):
        call_command("jobq_search_index", database="default", stdout=io.StringIO())
    with pytest.raises(CommandError, match="no database"):
        call_command("jobq_search_index", database="nowhere", stdout=io.StringIO())


def test_a_sort_by_a_column_without_an_index_sorts_the_newest_jobs_and_says_so(
    admin_client, alias, monkeypatch
):
    """Defect 6's last views: job id, handler, priority and worker have no index in their
    order, and a full sort of a million rows took 0.25-0.4 s on PostgreSQL. They sort the
    newest ``SORT_ROWS`` jobs of the list instead, saying so."""
    monkeypatch.setattr(listing, "SORT_ROWS", 4)
    add(alias, "job", 9)
    Job.objects.using(alias).filter(job_id__in=["job-1", "job-3"]).update(worker="a-worker")
    cl = admin_client.get(LIST).context["cl"]
    column = list(cl.list_display).index("worker")
    page = admin_client.get(LIST, {"o": str(column)})
    shown = ids(page)
    assert sorted(shown) == ["job-0", "job-1", "job-2", "job-3"]  # the newest 4 only
    assert [job.worker for job in page.context["cl"].result_list] == [
        "",
        "",
        "a-worker",
        "a-worker",
    ]
    assert b"Sorted the newest 4 jobs of this list" in page.content and b"by worker" in page.content
    down = admin_client.get(LIST, {"o": f"-{column}"})
    assert [job.worker for job in down.context["cl"].result_list][:2] == ["a-worker", "a-worker"]
    plain = admin_client.get(LIST)  # the default sort has its index: every job, no note
    assert len(ids(plain)) == 9 and b"jobq-sort-note" not in plain.content
    monkeypatch.setattr(listing, "SORT_ROWS", 50)  # a list that small is sorted whole
    whole = admin_client.get(LIST, {"o": str(column)})
    assert len(ids(whole)) == 9 and b"jobq-sort-note" not in whole.content
