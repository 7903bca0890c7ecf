"""The admin in a real browser: Playwright drives Debian's headless Chromium (/usr/bin/chromium,
installed by scripts/ensure-chromium; Playwright never downloads a browser here) against
pytest-django's live server, on the embedded database backend.

Screenshots of every page go to ``$JOBQ_SCREENSHOTS`` when set (``docs/screenshots`` for the
README), else to the test's temporary directory: taking them is part of the check that each
page renders, light and dark, wide and phone-narrow.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from django_jobq.models import Job, Schedule
from django_jobq.queue import Queue
from django_jobq.storage.database import DatabaseStorage

CHROMIUM = "/usr/bin/chromium"
# Playwright gives up on a navigation or a selector after 30 s by default; on a loaded machine
# Chromium and the live server can take that long, so the tests wait for pages, not a clock.
PAGE_TIMEOUT_MS = 120_000
pytestmark = [pytest.mark.browser, pytest.mark.django_db(databases=["default"], transaction=True)]
ERROR = b'{"type": "TimeoutError", "message": "upstream took too long", "traceback": "Traceback (most recent call last):\\n  File \\"shop/tasks.py\\", line 42, in charge\\n    raise TimeoutError(\\"upstream took too long\\")"}'  # noqa: E501


@pytest.fixture(scope="module")
def browser():
    """One browser for this module, closed at its end: Playwright's sync API keeps an event
    loop running in the main thread while it is open, which would break every later test that
    calls asyncio.run()."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run scripts/ensure-chromium", pytrace=False)
    # Django's ORM calls of the fixtures below are plain blocking calls made while that loop
    # runs, which is what the test thread wants; the check comes back after this module.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as pw:
            chromium = pw.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
            )
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def shots(tmp_path) -> Path:
    target = Path(os.environ.get("JOBQ_SCREENSHOTS") or tmp_path)
    target.mkdir(parents=True, exist_ok=True)
    return target


@pytest.fixture
def jobs(settings):
    """A day of history on three queues, made through the storage API with a clock set back,
    so the charts and lists have something to show."""
    settings.JOBQ = {**settings.JOBQ, "BACKEND": "database", "DATABASE_ALIAS": "default"}
    now = int(timezone.now().timestamp() * 1000)
    clock = {"now": now}
    storage = DatabaseStorage("default", clock=lambda: clock["now"])
    rng = random.Random(6)
    for name, per_step, fail_every in (("emails", 3, 9), ("reports", 1, 4), ("webhooks", 2, 0)):
        queue = Queue(name, storage=storage)
        for step in range(40, 0, -1):
            clock["now"] = now - step * 90_000
            ids = [f"{name}-{step}-{i}" for i in range(per_step)]
            queue.enqueue_many([(i, {"to": f"user{n}@example.com"}) for n, i in enumerate(ids)])
            clock["now"] += rng.randint(50, 3000)
            for n, claimed in enumerate(storage.claim(name, "worker-a", per_step, 30_000).jobs):
                clock["now"] += rng.randint(20, 800)
                if fail_every and (step + n) % fail_every == 0:
                    storage.fail(name, claimed.job_id, claimed.token, ERROR, permanent=True)
                else:
                    storage.complete(name, claimed.job_id, claimed.token, b'{"sent": true}')
    clock["now"] = now
    emails = Queue("emails", storage=storage)
    emails.enqueue("welcome-4711", {"to": "new@example.com"})
    emails.enqueue("digest-2026-11-24", {"to": "all"}, delay=3_600_000, priority=5)
    storage.register_worker(
        "worker-a", {"host": "app-1", "pid": 3121, "queues": ["emails", "reports", "webhooks"],
                     "concurrency": 8, "pool": "thread", "started": now - 3_600_000},
        3_600_000,
    )  # fmt: skip
    Schedule.objects.create(name="nightly-report", queue="reports", cron="0 3 * * *")
    Schedule.objects.create(name="cleanup", queue="emails", interval=900, timezone="UTC")
    return storage


def login(page, base: str, username: str) -> None:
    page.goto(f"{base}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_selector("#content")


def row_pk(job_id: str) -> int:
    return Job.objects.get(job_id=job_id).pk


def test_operator_sees_the_queues_filters_cancels_and_retries(browser, live_server, jobs, shots):
    User.objects.create_superuser("ops", password="pw")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    base = live_server.url
    login(page, base, "ops")

    page.goto(f"{base}/admin/django_jobq/queueconfig/")
    assert page.locator("#jobq-queues tr[data-queue]").count() == 3
    emails = page.locator("#jobq-queues tr[data-queue=emails] td").all_inner_texts()
    assert emails[:2] == ["1", "1"]  # one queued, one scheduled
    page.screenshot(path=shots / "overview.png", full_page=True)

    page.click("#jobq-pause-reports")
    page.wait_for_selector("#jobq-resume-reports")
    assert Queue("reports").is_paused()
    page.click("#jobq-resume-reports")
    page.wait_for_selector("#jobq-pause-reports")

    page.goto(f"{base}/admin/django_jobq/queueconfig/q/emails/")
    assert page.locator("figure.jobq-chart").count() == 4
    page.screenshot(path=shots / "queue.png", full_page=True)

    page.goto(f"{base}/admin/django_jobq/job/")
    page.click("#changelist-filter a:text-is('Failed')")
    page.wait_for_url("**state__exact=failed**")
    states = page.locator("#result_list .jobq-state").all_inner_texts()
    assert states and set(states) == {"failed"}
    page.screenshot(path=shots / "jobs.png", full_page=False)

    # Cancel a queued job from its page: confirm, then see the new state.
    page.goto(f"{base}/admin/django_jobq/job/{row_pk('welcome-4711')}/change/")
    page.click("#jobq-act-cancel")
    page.click("#jobq-confirm")
    assert page.locator("#jobq-row-state").inner_text() == "cancelled"

    # Retry a failed one.
    failed = Job.objects.filter(queue="reports", state="failed").order_by("-id").first()
    assert failed is not None
    page.goto(f"{base}/admin/django_jobq/job/{failed.pk}/change/")
    page.screenshot(path=shots / "job.png", full_page=True)
    page.click("#jobq-act-retry")
    page.click("#jobq-confirm")
    assert page.locator("#jobq-row-state").inner_text() == "queued"

    page.goto(f"{base}/admin/django_jobq/workerinfo/")
    assert "app-1" in page.locator("#jobq-workers").inner_text()
    page.screenshot(path=shots / "workers.png", full_page=True)
    page.goto(f"{base}/admin/django_jobq/schedule/")
    assert "nightly-report" in page.locator("#result_list").inner_text()
    page.screenshot(path=shots / "schedules.png", full_page=False)
    context.close()

    dark = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="dark")
    page = dark.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    login(page, base, "ops")
    page.goto(f"{base}/admin/django_jobq/queueconfig/q/emails/")
    page.screenshot(path=shots / "queue-dark.png", full_page=True)
    dark.close()

    phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = phone.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    login(page, base, "ops")
    page.goto(f"{base}/admin/django_jobq/queueconfig/")
    # Nothing wider than the screen except inside the scrolling table wrapper.
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 400, width
    page.screenshot(path=shots / "overview-phone.png", full_page=True)
    phone.close()


def test_a_viewer_cannot_cancel(browser, live_server, jobs):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    for codename in ("view_job", "view_queueconfig"):
        viewer.user_permissions.add(Permission.objects.get(codename=codename))
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    base = live_server.url
    login(page, base, "viewer")
    pk = row_pk("welcome-4711")
    page.goto(f"{base}/admin/django_jobq/job/{pk}/change/")
    assert page.locator("#jobq-row-state").inner_text() == "queued"
    assert page.locator("#jobq-act-cancel").count() == 0
    response = page.goto(f"{base}/admin/django_jobq/job/{pk}/act/cancel/")
    assert response is not None and response.status == 403
    page.goto(f"{base}/admin/django_jobq/queueconfig/")
    assert page.locator("#jobq-pause-emails").count() == 0
    assert Job.objects.get(pk=pk).state == "queued"
    context.close()
