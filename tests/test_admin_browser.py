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
from django.urls import reverse
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


def test_a_running_jobs_progress_bar_moves_without_a_reload(browser, live_server, jobs, shots):
    """The job page polls its live JSON: progress reported by the running attempt moves the
    bar in place, and the state badge turns "completed" when the job ends."""
    User.objects.create_superuser("ops", password="pw")
    queue = Queue("live", storage=jobs)
    queue.enqueue("render-1", {"pages": 60})
    [claimed] = jobs.claim("live", "worker-a", 1, 600_000).jobs
    assert jobs.report("live", "render-1", claimed.token, progress=b'{"step": 20, "of": 60}')
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    base = live_server.url
    login(page, base, "ops")
    page.goto(f"{base}/admin/django_jobq/job/{row_pk('render-1')}/change/")
    bar = page.locator("#jobq-progress-bar")
    assert bar.get_attribute("aria-valuenow") == "33"
    page.evaluate("window.jobqSamePage = true")  # gone if the page reloads
    assert jobs.report("live", "render-1", claimed.token, progress=b'{"step": 45, "of": 60}')
    page.wait_for_function(
        "document.getElementById('jobq-progress-bar').getAttribute('aria-valuenow') === '75'"
    )
    assert page.evaluate("window.jobqSamePage") is True
    assert '"step": 45' in page.locator("#jobq-progress").inner_text()
    assert "updated" in page.locator("#jobq-updated").inner_text()
    page.screenshot(path=shots / "job-running.png", full_page=False)
    jobs.complete("live", "render-1", claimed.token, b'{"pages": 60}')
    page.wait_for_function("document.getElementById('jobq-row-state').textContent === 'completed'")
    assert page.evaluate("window.jobqSamePage") is True
    context.close()


OVERFLOWING = """() => [...document.querySelectorAll('#content table')].flatMap(t => {
    const box = t.closest('.jobq-scroll, .results, .module, #content-main') || t.parentElement;
    const over = t.getBoundingClientRect().right - box.getBoundingClientRect().right;
    return over > 1 ? [`${t.id || t.className || 'table'}: ${Math.round(over)} px too wide`] : [];
})"""


#: Every element whose text is cut or hyphenated where an operator reads it: soft hyphens
#: in column heads ("Sched-uled"), and text wider than the page.
HYPHENATED = """() => [...document.querySelectorAll('th')].map(th => th.textContent)
    .filter(text => text.includes('\u00ad'))"""

#: WCAG contrast of the job page's error heading against its background.
CONTRAST = """() => {
  const h = document.querySelector('.jobq-error h2');
  if (!h) return null;
  const rgb = c => c.match(/[\\d.]+/g).slice(0, 3).map(Number).map(v => {
    v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
  const lum = c => { const [r, g, b] = rgb(c); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const style = getComputedStyle(h);
  const [a, b] = [lum(style.color), lum(style.backgroundColor)].sort((x, y) => y - x);
  return (a + 0.05) / (b + 0.05);
}"""


#: The smallest chart axis label as drawn on screen, in CSS px.
AXIS_PX = """() => {
  const sizes = [...document.querySelectorAll('.jobq-chart svg')].map(svg => {
    const label = svg.querySelector('.axis');
    return label ? parseFloat(getComputedStyle(label).fontSize) * svg.getScreenCTM().a : null;
  }).filter(v => v !== null);
  return sizes.length ? Math.min(...sizes) : null;
}"""


def console_pages(failed: Job) -> list[tuple[str, str]]:
    """(name, path) of every page of the console an operator opens."""
    return [
        ("overview", reverse("admin:django_jobq_queueconfig_changelist")),
        ("queue", reverse("admin:django_jobq_queue_detail", args=["emails"])),
        ("queue-settings", reverse("admin:django_jobq_queue_settings", args=["emails"])),
        ("pause-all", reverse("admin:django_jobq_queue_pause_all", args=["pause"])),
        ("dead-retry", reverse("admin:django_jobq_queue_dead", args=["emails", "retry"])),
        ("jobs", reverse("admin:django_jobq_job_changelist")),
        ("jobs-failed", reverse("admin:django_jobq_job_changelist") + "?state__exact=failed"),
        ("job", reverse("admin:django_jobq_job_change", args=[failed.pk])),
        ("workers", reverse("admin:django_jobq_workerinfo_changelist")),
        ("schedules", reverse("admin:django_jobq_schedule_changelist")),
    ]


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("width", [1280, 1920])
def test_every_console_page_fits_with_the_menu_open_light_and_dark(
    browser, live_server, jobs, scheme, width, shots
):
    """Issue 37's design checks, by script on every page at 1280 and 1920 px in both themes,
    the navigation sidebar open: nothing wider than the page, no table wider than its box
    (job ids and handler names truncate), no hyphenated column head, the error heading
    readable (contrast ≥ 4.5:1; the dark theme's was 2:1). A screenshot of each page."""
    User.objects.create_superuser("ops", password="pw")
    context = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=scheme)
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    base = live_server.url
    login(page, base, "ops")
    Job.objects.filter(job_id="welcome-4711").update(
        handler="shop.tasks.synchronise_the_customer_relationship_records_with_the_crm"
    )
    failed = Job.objects.filter(state="failed").order_by("-id").first()
    assert failed is not None
    for name, path in console_pages(failed):
        page.goto(f"{base}{path}")
        page.wait_for_selector("#content")
        assert page.locator("#nav-sidebar").is_visible(), path  # the left menu is open
        assert page.evaluate(OVERFLOWING) == [], path
        width_now = page.evaluate("document.documentElement.scrollWidth")
        assert width_now <= width, (path, width_now)
        assert page.evaluate(HYPHENATED) == [], path
        if name == "queue":  # chart labels as drawn: an SVG scaled down shrank them to 6 px
            smallest = page.evaluate(AXIS_PX)
            assert smallest is not None and smallest >= 11, (width, smallest)
        if name == "job":
            contrast = page.evaluate(CONTRAST)
            assert contrast is not None and contrast >= 4.5, (scheme, contrast)
        page.screenshot(path=shots / f"{name}-{width}-{scheme}.png", full_page=True)
    context.close()


def test_api_docs_load_nothing_from_other_hosts_and_ask_to_log_in(browser, live_server, shots):
    """Swagger UI and Redoc work offline: every request the pages make (scripts, styles,
    fonts, the schema) goes to this server. Logged out, the visitor is asked to log in
    instead of reading "Failed to load API definition"."""
    from urllib.parse import urlsplit

    User.objects.create_superuser("docs", password="pw")
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    base = live_server.url
    ours = {"", urlsplit(base).netloc}  # data: and blob: URLs have no host
    elsewhere: set[str] = set()  # requests to other hosts the pages tried
    blocked: set[str] = set()  # ... that the browser refused (the page's CSP)
    page.on("request", lambda r: None if urlsplit(r.url).netloc in ours else elsewhere.add(r.url))
    page.on(
        "requestfailed",
        lambda r: blocked.add(r.url) if r.failure == "csp" else None,  # Chromium's reason
    )
    page.goto(f"{base}/jobq/docs/")
    page.wait_for_selector("#id_username")  # the admin's login page, not Swagger's failure
    assert "Failed to load API definition" not in page.content()
    page.fill("#id_username", "docs")
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_selector(".swagger-ui .opblock")  # back on Swagger UI, the schema loaded
    assert "Failed to load API definition" not in page.content()
    page.screenshot(path=shots / "api-swagger.png")
    response = page.goto(f"{base}/jobq/redoc/")
    html = response.text()
    page.wait_for_selector("#redoc-container .api-content, redoc .api-content")
    page.wait_for_load_state("networkidle")  # every request the page makes has ended
    page.screenshot(path=shots / "api-redoc.png")
    referenced = {urlsplit(url).netloc for url in _urls_in(html)}
    assert referenced <= {"", urlsplit(base).netloc}, referenced
    assert elsewhere <= blocked, elsewhere - blocked  # none reached another host
    context.close()


def _urls_in(html: str) -> list[str]:
    """Every src/href of the page, and any absolute URL in its text (a preconnect, an
    @import)."""
    import re

    attrs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)""", html)
    return attrs + re.findall(r"https?://[^\s\"'<>)]+", html)


LINE_NUMBERS_CLIPPED = """() => {
    const box = document.getElementById('jobq-logs').getBoundingClientRect();
    return [...document.querySelectorAll('#jobq-logs .jobq-ln')].filter(n => {
        const r = n.getBoundingClientRect();
        return r.left < box.left - 0.5 || n.scrollWidth > n.clientWidth + 0.5;
    }).map(n => n.textContent);
}"""


def test_log_line_numbers_are_not_clipped_and_the_latest_attempt_is_on_top(
    browser, live_server, jobs, shots
):
    User.objects.create_superuser("ops", password="pw")
    ticks = iter(range(int(timezone.now().timestamp() * 1000), 1 << 62))
    jobs = DatabaseStorage("default", clock=lambda: next(ticks))  # a millisecond per call
    queue = Queue("chatty", storage=jobs)
    queue.enqueue("long-1", {"pages": 200}, max_attempts=2)
    [first] = jobs.claim("chatty", "worker-a", 1, 600_000).jobs
    for n in range(120):
        assert jobs.report("chatty", "long-1", first.token, log=f"first attempt, step {n}")
    jobs.fail("chatty", "long-1", first.token, ERROR, retry_in=0)
    [second] = jobs.claim("chatty", "worker-a", 1, 600_000).jobs
    assert jobs.report("chatty", "long-1", second.token, log="second attempt, started")
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    login(page, live_server.url, "ops")
    page.goto(f"{live_server.url}/admin/django_jobq/job/{row_pk('long-1')}/change/")
    headings = page.locator("#jobq-logs .jobq-log-attempt").all_inner_texts()
    assert headings[0].startswith("attempt 2") and headings[-1].startswith("attempt 1")
    assert page.locator("#jobq-logs li").first.inner_text().endswith("second attempt, started")
    assert page.locator("#jobq-logs .jobq-ln").first.inner_text() == "100"  # the last 100 kept
    assert page.evaluate(LINE_NUMBERS_CLIPPED) == []
    page.screenshot(path=shots / "job-logs.png", full_page=False)
    context.close()


def test_overview_and_workers_pages_update_in_place(browser, live_server, jobs, shots):
    """The overview's counts and the workers list follow the storage without a reload."""
    User.objects.create_superuser("ops", password="pw")
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    base = live_server.url
    login(page, base, "ops")
    page.goto(f"{base}/admin/django_jobq/queueconfig/?refresh=10")
    queued = "document.querySelector('tr[data-queue=\"webhooks\"] td').textContent.trim()"
    before = page.evaluate(queued)
    page.evaluate("window.jobqSamePage = true")  # gone if the page reloads
    Queue("webhooks", storage=jobs).enqueue_many([(f"hook-new-{n}", n) for n in range(7)])
    page.wait_for_function(f"{queued} !== {before!r}")
    assert int(page.evaluate(queued)) == int(before.replace("—", "0")) + 7
    assert page.evaluate("window.jobqSamePage") is True
    assert page.locator("#jobq-updated").inner_text().startswith("updated")
    page.goto(f"{base}/admin/django_jobq/workerinfo/")
    page.evaluate("window.jobqSamePage = true")
    assert "worker-b" not in page.locator("#jobq-workers").inner_text()
    jobs.register_worker("worker-b", {"host": "app-2", "pid": 77, "queues": ["emails"]}, 600_000)
    page.wait_for_function(
        "document.getElementById('jobq-workers').textContent.includes('worker-b')"
    )
    assert page.evaluate("window.jobqSamePage") is True
    context.close()


def test_the_queue_page_updates_in_place(browser, live_server, jobs, shots):
    """The queue page's counts follow the storage without a reload (no meta refresh)."""
    User.objects.create_superuser("ops", password="pw")
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    base = live_server.url
    login(page, base, "ops")
    navigations = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    page.goto(f"{base}/admin/django_jobq/queueconfig/q/webhooks/")
    assert page.locator("meta[http-equiv=refresh]").count() == 0
    queued = "document.querySelector('#jobq-queue-body td').textContent.trim()"
    before = page.evaluate(queued)
    loaded = len(navigations)
    page.evaluate("window.jobqSamePage = true")  # gone if the page reloads
    Queue("webhooks", storage=jobs).enqueue_many([(f"hook-q-{n}", n) for n in range(5)])
    page.wait_for_function(f"{queued} !== {before!r}")
    assert int(page.evaluate(queued)) == int(before.replace("—", "0")) + 5
    assert page.evaluate("window.jobqSamePage") is True and len(navigations) == loaded
    assert page.locator("#jobq-updated").inner_text().startswith("updated")
    assert page.locator("figure.jobq-chart").count() == 4  # the live windows, redrawn
    context.close()
    phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = phone.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    login(page, base, "ops")
    page.goto(f"{base}/admin/django_jobq/queueconfig/q/emails/")
    assert page.evaluate("document.documentElement.scrollWidth") <= 400
    page.screenshot(path=shots / "queue-phone.png", full_page=True)
    phone.close()


def test_an_action_over_every_job_of_a_filter_confirms_and_goes_on_by_itself(
    browser, live_server, jobs, shots, monkeypatch
):
    """Tick all, "Select all … matching this filter", Retry: a confirmation with the count and
    the filter, then the run, one job per request here, going on by itself to the end."""
    from django.contrib import admin as django_admin

    from django_jobq.admin import filtered

    monkeypatch.setattr(django_admin.site._registry[Job], "list_per_page", 4)
    monkeypatch.setattr(filtered, "TIME_BUDGET", 0)  # one job per request: progress to see
    failed = Job.objects.filter(queue="reports", state="failed").count()
    assert failed > 4  # more than a page
    User.objects.create_superuser("ops", password="pw")
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    base = live_server.url
    login(page, base, "ops")
    page.goto(f"{base}/admin/django_jobq/job/?queue=reports&state__exact=failed")
    page.check("#action-toggle")
    page.click("#jobq-select-across")
    page.select_option("select[name=action]", "retry_jobs")
    page.screenshot(path=shots / "jobs-select-all.png", full_page=False)
    page.click("button[name=index]")
    page.wait_for_selector("#jobq-filter-count")
    assert f"{failed} jobs match" in page.locator("#jobq-filter-count").inner_text()
    assert "queue = reports" in page.locator("#jobq-filter").inner_text()
    assert Job.objects.filter(queue="reports", state="failed").count() == failed  # only asked
    page.screenshot(path=shots / "filter-confirm.png", full_page=True)
    page.click("#jobq-filter-go")
    page.wait_for_selector("#jobq-filter-progress:has-text('Working')")
    page.screenshot(path=shots / "filter-progress.png", full_page=True)
    page.wait_for_selector("#jobq-filter-progress:has-text('Finished')")
    outcomes = page.locator("#jobq-filter-outcomes tbody").inner_text()
    assert f"retried\t{failed}" in outcomes, outcomes
    assert Job.objects.filter(queue="reports", state="failed").count() == 0
    context.close()
    asking = f"{base}/admin/django_jobq/job/filter/delete/?queue=emails&state__exact=completed"
    for name, options in (
        ("filter-confirm-dark.png", {"viewport": {"width": 1366, "height": 900},
                                     "color_scheme": "dark"}),
        ("filter-confirm-phone.png", {"viewport": {"width": 390, "height": 844},
                                      "is_mobile": True}),
    ):  # fmt: skip
        other = browser.new_context(**options)
        page = other.new_page()
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        login(page, base, "ops")
        page.goto(asking)
        assert "jobs match" in page.locator("#jobq-filter-count").inner_text()
        assert page.evaluate("document.documentElement.scrollWidth") <= options["viewport"]["width"]
        page.screenshot(path=shots / name, full_page=True)
        other.close()


def test_the_job_list_updates_in_place_but_keeps_ticked_rows(browser, live_server, jobs, shots):
    User.objects.create_superuser("ops", password="pw")
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    base = live_server.url
    login(page, base, "ops")
    page.goto(f"{base}/admin/django_jobq/job/?queue=emails&state__exact=queued")
    page.evaluate("window.jobqSamePage = true")  # gone if the page reloads
    assert "fresh-1" not in page.locator("#result_list").inner_text()
    Queue("emails", storage=jobs).enqueue("fresh-1", {"to": "x@example.com"})
    page.wait_for_function("document.getElementById('result_list').textContent.includes('fresh-1')")
    assert page.evaluate("window.jobqSamePage") is True
    page.locator("input.action-select").first.check()  # choosing rows: the list holds still
    polls = "Number(document.getElementById('jobq-results-box').dataset.jobqPolls || 0)"
    Queue("emails", storage=jobs).enqueue("fresh-2", {"to": "y@example.com"})
    stored = page.evaluate(polls)
    page.wait_for_function(f"{polls} >= {stored + 2}")  # a poll answered after fresh-2 stored
    assert "fresh-2" not in page.locator("#result_list").inner_text()
    assert page.locator("input.action-select:checked").count() == 1
    context.close()


def test_retry_all_dead_letters_goes_on_by_itself_to_the_end(
    browser, live_server, jobs, shots, monkeypatch
):
    """Issue 37, defect 1: one chunk per request here (a 10 s budget in production); the
    page sends itself again while "go on by itself" is ticked, to the end, with no click
    per round."""
    from django.urls import reverse

    from django_jobq.admin import deadletters
    from django_jobq.queue import Queue

    monkeypatch.setattr(deadletters, "CHUNK", 1)
    monkeypatch.setattr(deadletters, "TIME_BUDGET", 0)
    dead = Queue("reports").count_dead()
    assert dead > 2  # several requests
    User.objects.create_superuser("ops", password="pw")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    base = live_server.url
    login(page, base, "ops")
    page.goto(base + reverse("admin:django_jobq_queue_dead", args=["reports", "retry"]))
    page.click("#jobq-dead-go")
    page.wait_for_selector("#jobq-dead-form[data-jobq-autosubmit]", state="attached")
    page.screenshot(path=shots / "dead-retry-progress.png", full_page=True)
    page.wait_for_selector("#jobq-dead-count:has-text('no dead letters')")
    assert "requeued" in page.locator("#jobq-dead-summary").inner_text()
    assert Queue("reports").count_dead() == 0
    context.close()
