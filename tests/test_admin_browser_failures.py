"""Failure triage, every attempt's error and the schedules' recent runs in a real browser
(headless Chromium through Playwright, as tests/test_admin_browser.py), on the embedded
database backend: screenshots at 1280 and 1920 px, light and dark, and no horizontal
overflow of the page with the admin's menu open."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from django_jobq.admin import failures
from django_jobq.backend import get_storage
from django_jobq.models import Job, Schedule
from django_jobq.queue import Queue
from django_jobq.schedules.core import tick_job_id

from . import test_admin_browser as shared

# The browser module's fixtures, shared: one Chromium, its screenshot dir, its day of history.
browser, shots, jobs = shared.browser, shared.shots, shared.jobs
PAGE_TIMEOUT_MS, login = shared.PAGE_TIMEOUT_MS, shared.login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(databases=["default"], transaction=True)]
NO_PAGE_OVERFLOW = "document.documentElement.scrollWidth <= window.innerWidth"


def error(kind: str, message: str, traceback: str = "") -> bytes:
    return json.dumps({"type": kind, "message": message, "traceback": traceback}).encode()


def dead(queue: str, job_id: str, body: bytes) -> None:
    storage = get_storage()
    Queue(queue).enqueue(job_id, {"n": job_id}, max_attempts=1)
    [claimed] = storage.claim(queue, "worker-b", 1, 30_000).jobs
    storage.fail(queue, claimed.job_id, claimed.token, body, permanent=True)


@pytest.fixture
def failing(jobs):
    """The browser module's day of history, plus dead letters of several kinds (hostile
    ones included), a job that failed three attempts, and a schedule with runs."""
    for i, n in enumerate((8812, 9911, 1234, 5150)):
        dead("webhooks", f"hook-{i}", error("TimeoutError", f"timeout after 3.{i}s on job {n}"))
    dead("webhooks", "html", error("<b>Bold</b>Error", '<script>alert("x")</script> ' * 20))
    dead("webhooks", "wide", error("ValueError", "Ungültig ☃ " + "x" * 3000))
    storage = get_storage()
    Queue("webhooks").enqueue("flaky-7", {}, max_attempts=3)
    for i, message in enumerate(("disk full on /var", "disk full on /tmp", "no space left")):
        [claimed] = storage.claim("webhooks", "worker-b", 1, 30_000).jobs
        trace = "Traceback (most recent call last):\n" + f'  File "sync.py", line {40 + i}\n' * 6
        storage.fail("webhooks", "flaky-7", claimed.token,
                     error("OSError", message, trace), retry_in=0)  # fmt: skip
    nightly = Schedule.objects.get(name="nightly-report")
    for hour in range(3):
        tick = dt.datetime(2026, 11, 20 + hour, 3, tzinfo=dt.UTC)
        Queue("reports").enqueue(tick_job_id(nightly.name, tick), {})
        [claimed] = storage.claim("reports", "worker-b", 1, 30_000).jobs
        if hour == 1:
            storage.fail("reports", claimed.job_id, claimed.token, error("E", "x"), permanent=True)
        else:
            storage.complete("reports", claimed.job_id, claimed.token, b"{}")
    return nightly


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("width", [1280, 1920])
def test_failures_attempts_and_schedules_pages_fit_light_and_dark(
    browser,
    live_server,
    failing,
    shots,
    scheme,
    width,
):
    User.objects.create_superuser("ops", password="pw")
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    page.emulate_media(color_scheme=scheme)
    base = live_server.url
    login(page, base, "ops")
    flaky = Job.objects.get(job_id="flaky-7")
    group = next(g for g in failures.triage(["webhooks"]).groups if g.error_type == "TimeoutError")
    pages = {
        "failures": reverse("admin:django_jobq_failures"),
        "failures-queue": reverse("admin:django_jobq_failures") + "?queue=webhooks",
        "failures-confirm": reverse("admin:django_jobq_failures_action", args=["retry"])
        + f"?group={group.key}",
        "attempts": reverse("admin:django_jobq_job_change", args=[flaky.pk]),
        "schedules": reverse("admin:django_jobq_schedule_changelist"),
        "schedule": reverse("admin:django_jobq_schedule_change", args=[failing.pk]),
    }
    for name, path in pages.items():
        page.goto(base + path)
        assert page.locator("#nav-sidebar").is_visible(), name  # the left menu is open
        assert page.evaluate(NO_PAGE_OVERFLOW), (name, page.evaluate(
            "[document.documentElement.scrollWidth, window.innerWidth]"))  # fmt: skip
        assert page.evaluate(shared.OVERFLOWING) == [], name  # nor a table wider than its box
        page.screenshot(path=shots / f"{name}-{width}-{scheme}.png", full_page=True)
    context.close()


def test_the_failures_page_groups_and_a_group_is_retried_to_the_end_by_itself(
    browser,
    live_server,
    failing,
    shots,
    monkeypatch,
):
    monkeypatch.setattr(failures, "CHUNK", 2)
    monkeypatch.setattr(failures, "TIME_BUDGET", 0)  # one chunk per request: several rounds
    User.objects.create_superuser("ops", password="pw")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    base = live_server.url
    login(page, base, "ops")
    page.goto(base + reverse("admin:django_jobq_queue_detail", args=["webhooks"]))
    page.click("#jobq-failures-link")
    page.wait_for_url("**/failures/?queue=webhooks")
    row = page.locator("#jobq-failures tr", has_text="TimeoutError")
    assert "timeout after <n>s on job <n>" in row.inner_text()
    assert row.locator("td.num").inner_text() == "4"
    assert page.locator("script:has-text('alert')").count() == 0  # shown as text
    assert "<script>" in page.locator("#jobq-failures").inner_text()
    row.locator("a:text-is('Retry')").click()
    page.wait_for_selector("#jobq-failure-count")
    assert "4 dead letters of this group" in page.locator("#jobq-failure-count").inner_text()
    page.screenshot(path=shots / "failures-retry-confirm.png", full_page=True)
    page.click("#jobq-failure-go")
    page.wait_for_selector("#jobq-failure-form[data-jobq-autosubmit]", state="attached")
    page.screenshot(path=shots / "failures-retry-progress.png", full_page=True)
    page.wait_for_selector("#jobq-failure-progress:has-text('Finished')")
    assert "4 requeued" in page.locator("#jobq-failure-progress").inner_text()
    assert [Queue("webhooks").get_status(f"hook-{i}").state.value for i in range(4)] == (
        ["queued"] * 4
    )
    assert Queue("webhooks").get_status("html").state.value == "failed"  # another group
    page.click("#jobq-failure-back")
    assert page.locator("#jobq-failures tr", has_text="TimeoutError").count() == 0
    context.close()


def test_the_job_page_lists_each_attempts_error_with_its_traceback_collapsed(
    browser,
    live_server,
    failing,
    shots,
):
    User.objects.create_superuser("ops", password="pw")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    base = live_server.url
    login(page, base, "ops")
    flaky = Job.objects.get(job_id="flaky-7")
    page.goto(base + reverse("admin:django_jobq_job_change", args=[flaky.pk]))
    attempts = page.locator("#jobq-attempts details.jobq-attempt-error")
    assert attempts.count() == 3
    heads = attempts.locator("summary").all_inner_texts()
    assert "attempt 3" in heads[0] and "no space left" in heads[0]
    assert "attempt 1" in heads[2] and "disk full on /var" in heads[2]
    oldest = attempts.nth(2).locator(".jobq-attempt-traceback")
    assert not oldest.is_visible()  # collapsed until asked for
    attempts.nth(2).locator("summary").click()
    assert oldest.is_visible() and "line 40" in oldest.inner_text()
    page.locator("#jobq-attempts").screenshot(path=shots / "attempts.png")
    context.close()
