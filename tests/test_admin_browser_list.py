"""The job list's deep pages and its "search in" choice in a real browser (issue 37): a deep
page of a filtered list shows its rows with the filter still selected, and the pager goes on
past where a capped count stops. Chromium through Playwright, as in test_admin_browser.py,
whose fixtures these tests share."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from django_jobq.admin import listing
from django_jobq.admin.jobs import JobAdmin
from django_jobq.backend import get_storage
from django_jobq.models import Job

from . import test_admin_browser as shared
from .test_admin_browser import PAGE_TIMEOUT_MS, login

# The browser (one per module) and the screenshot folder of the admin's browser tests.
browser = shared.browser
shots = shared.shots

pytestmark = [pytest.mark.browser, pytest.mark.django_db(databases=["default"], transaction=True)]
Q = "emails"


@pytest.fixture
def many_failed(settings, monkeypatch) -> None:
    """30 failed jobs and 10 completed ones, two a page, counted up to 5: page 10 of the
    failed jobs is far past where the capped count ("more than 5 jobs") stops."""
    settings.JOBQ = {**settings.JOBQ, "BACKEND": "database", "DATABASE_ALIAS": "default"}
    monkeypatch.setattr(JobAdmin, "list_per_page", 2)
    monkeypatch.setattr(listing, "COUNT_CAP", 5)
    get_storage().register_queue(Q)
    now = timezone.now()
    Job.objects.bulk_create(
        Job(
            queue=Q, job_id=f"{state}-{i}", state=state, handler="shop.tasks.charge",
            payload=b'{"colour":"%s"}' % (b"blue" if i % 2 else b"red"),
            created_at=now - dt.timedelta(seconds=i), finished_at=now,
        )
        for state, count in (("failed", 30), ("completed", 10))
        for i in range(count)
    )  # fmt: skip


def chosen_state(page) -> list[str]:
    """The choice the state filter shows as selected in the sidebar."""
    return page.locator(
        "#changelist-filter details[data-filter-title='state'] li.selected a"
    ).all_inner_texts()


def shown(page) -> list[str]:
    return page.locator("#result_list tbody a.jobq-id").all_inner_texts()


def test_a_deep_page_of_a_filtered_list_keeps_its_filter_and_the_pager_goes_on(
    browser,
    live_server,
    many_failed,
    shots,
):
    User.objects.create_superuser("ops", password="pw")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    login(page, live_server.url, "ops")

    page.goto(f"{live_server.url}/admin/django_jobq/job/")
    page.click("#changelist-filter a:text-is('Failed')")
    page.wait_for_url("**state__exact=failed**")
    page.goto(page.url + "&p=10")

    assert shown(page) == ["failed-18", "failed-19"]
    assert chosen_state(page) == ["Failed"]
    assert page.inner_text("#jobq-pager-count") == "more than 5 jobs"  # as the header says
    assert page.inner_text("#jobq-result-count").startswith("more than 5 jobs")
    page.screenshot(path=shots / "job-list-deep-page.png", full_page=True)
    page.click("#jobq-page-next")
    page.wait_for_url("**p=11**")
    assert "state__exact=failed" in page.url
    assert shown(page) == ["failed-20", "failed-21"]
    assert chosen_state(page) == ["Failed"]
    assert page.locator("#jobq-page-next").count() == 1  # the page is full: more may follow

    page.goto(page.url.replace("p=11", "p=500"))
    assert "No jobs on this page" in page.inner_text("#jobq-empty-page")
    page.click("#jobq-back-to-first")
    page.wait_for_url("**p=1**")
    assert shown(page) == ["failed-0", "failed-1"] and "state__exact=failed" in page.url
    context.close()


def test_searching_payloads_keeps_the_choice_and_the_filter_across_pages(
    browser,
    live_server,
    many_failed,
    shots,
):
    User.objects.create_superuser("ops", password="pw")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    login(page, live_server.url, "ops")
    page.goto(f"{live_server.url}/admin/django_jobq/job/?state__exact=failed")

    page.select_option("#jobq-search-in", "payload")
    page.fill("#searchbar", "BLUE")
    page.click("#changelist-search input[type=submit]")
    page.wait_for_url("**in=payload**")

    assert shown(page) == ["failed-1", "failed-3"]
    page.click("#jobq-page-next")
    page.wait_for_url("**p=2**")
    assert shown(page) == ["failed-5", "failed-7"]
    assert page.input_value("#jobq-search-in") == "payload"
    assert page.input_value("#searchbar") == "BLUE"
    assert chosen_state(page) == ["Failed"]
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0  # 1280 px with the menu open: the search row fits
    page.screenshot(path=shots / "job-list-search-payload.png", full_page=True)
    context.close()
