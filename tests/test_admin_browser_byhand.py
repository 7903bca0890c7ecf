"""Jobs by hand in a real browser (headless Chromium through Playwright, the fixtures of
tests/test_admin_browser.py): create a job from the form and see it on its page, duplicate a
job with an edited payload, run a finished one again, reschedule a delayed one, follow a
running job's log lines; each page at 1280 and 1920 px, light and dark, without sideways
scrolling."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from django_jobq.models import Job
from django_jobq.queue import Queue

from . import test_admin_browser as base
from .test_admin_browser import PAGE_TIMEOUT_MS, login, row_pk

# The browser tests' own fixtures: one Chromium per module, the screenshots' folder, a day of
# history on the database backend.
browser, shots, jobs = base.browser, base.shots, base.jobs

pytestmark = [pytest.mark.browser, pytest.mark.django_db(databases=["default"], transaction=True)]
WIDTHS = (1280, 1920)
FITS = "document.documentElement.scrollWidth <= window.innerWidth"


@pytest.fixture
def ops(browser, live_server):
    """A superuser's page at 1280 px, logged in; closed afterwards."""
    User.objects.create_superuser("ops", password="pw")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    login(page, live_server.url, "ops")
    yield page
    context.close()


def every_look(page, shots, name: str) -> None:
    """The page as it is, at each width, light and dark: a screenshot each, and no width
    where the document scrolls sideways."""
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            assert page.evaluate(FITS), (name, width, scheme)
            page.screenshot(path=shots / f"{name}-{width}-{scheme}.png", full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.emulate_media(color_scheme="light")


def test_a_job_made_with_the_form_is_shown_on_its_page(ops, live_server, jobs, shots):
    page = ops
    page.goto(f"{live_server.url}/admin/django_jobq/job/")
    page.click("#jobq-add-job")
    page.wait_for_selector("#jobq-job-form")
    page.fill("#id_queue", "emails")
    page.fill("#id_payload", '{"to": "hand@example.com", "lines": [1, 2]}')
    page.fill("#id_job_id", "by-hand-1")
    page.fill("#id_priority", "3")
    every_look(page, shots, "byhand-form")
    page.fill("#id_payload", '{"to": NaN}')  # refused, the form says why
    page.click("#jobq-enqueue")
    page.wait_for_selector("#jobq-form-error")
    assert "NaN is not JSON" in page.locator(".field-payload .errorlist").inner_text()
    every_look(page, shots, "byhand-form-error")
    assert not Job.objects.filter(job_id="by-hand-1").exists()
    page.fill("#id_payload", '{"to": "hand@example.com", "lines": [1, 2]}')
    page.click("#jobq-enqueue")
    page.wait_for_selector("#jobq-row-state")
    assert page.locator("#jobq-row-state").inner_text() == "queued"
    assert "by-hand-1" in page.locator("#jobq-new-job").inner_text()
    assert "hand@example.com" in page.locator("pre.jobq-pre").nth(1).inner_text()
    assert Queue("emails").get_status("by-hand-1").priority == 3


def test_a_duplicate_with_an_edited_payload_and_a_run_again(ops, live_server, jobs, shots):
    page = ops
    failed = Job.objects.filter(queue="reports", state="failed").order_by("-id").first()
    assert failed is not None
    page.goto(f"{live_server.url}/admin/django_jobq/job/{failed.pk}/change/")
    every_look(page, shots, "byhand-job-tools")
    page.click("#jobq-duplicate")
    page.wait_for_selector("#jobq-job-form")
    assert '"to": "user' in page.locator("#id_payload").input_value()
    assert page.locator("#id_queue").input_value() == "reports"
    every_look(page, shots, "byhand-duplicate")
    page.fill("#id_payload", '{"to": "edited@example.com"}')
    page.click("#jobq-enqueue")
    page.wait_for_selector("#jobq-row-state")
    copy_id = page.locator("#jobq-new-job").inner_text()
    assert copy_id != failed.job_id
    assert Queue("reports").get_payload(copy_id) == {"to": "edited@example.com"}
    page.goto(f"{live_server.url}/admin/django_jobq/job/{failed.pk}/change/")
    page.click("#jobq-run-again")
    page.wait_for_selector("#jobq-new-job")
    again_id = page.locator("#jobq-new-job").inner_text()
    assert again_id not in (copy_id, failed.job_id)
    assert Queue("reports").get_payload(again_id) == Queue("reports").get_payload(failed.job_id)
    assert Queue("reports").get_status(failed.job_id).state.value == "failed"


def test_a_delayed_job_is_rescheduled_and_all_delayed_promoted(ops, live_server, jobs, shots):
    page = ops
    pk = row_pk("digest-2026-11-24")
    page.goto(f"{live_server.url}/admin/django_jobq/job/{pk}/change/")
    target = (timezone.now() + dt.timedelta(days=2)).replace(microsecond=0)
    page.fill("#jobq-reschedule-at", timezone.localtime(target).strftime("%Y-%m-%dT%H:%M:%S"))
    page.click("#jobq-reschedule")
    page.wait_for_selector(".messagelist .success")
    assert "Reschedule to" in page.locator(".messagelist").inner_text()
    assert Queue("emails").get_status("digest-2026-11-24").run_at == target
    Queue("emails").enqueue("later-2", 2, delay=600_000)
    page.goto(f"{live_server.url}/admin/django_jobq/queueconfig/q/emails/")
    page.click("#jobq-promote-all")
    page.wait_for_selector("#jobq-promote-count")
    assert "2 delayed jobs" in page.locator("#jobq-promote-count").inner_text()
    every_look(page, shots, "byhand-promote-confirm")
    page.click("#jobq-promote-go")
    page.wait_for_selector("#jobq-promote-progress:has-text('Finished')")
    assert Queue("emails").get_status("digest-2026-11-24").state.value == "queued"
    assert Queue("emails").get_status("later-2").state.value == "queued"


def test_a_running_jobs_new_log_lines_appear_on_top_without_a_reload(
    ops,
    live_server,
    jobs,
    shots,
):
    page = ops
    Queue("live-logs", storage=jobs).enqueue("talky-1", {"pages": 3})
    [claimed] = jobs.claim("live-logs", "worker-a", 1, 600_000).jobs
    assert jobs.report("live-logs", "talky-1", claimed.token, log="first line")
    page.goto(f"{live_server.url}/admin/django_jobq/job/{row_pk('talky-1')}/change/")
    page.evaluate("window.jobqSamePage = true")  # gone if the page reloads
    assert jobs.report("live-logs", "talky-1", claimed.token, log="second line")
    page.wait_for_function(
        "document.querySelector('#jobq-logs li').textContent.endsWith('second line')"
    )
    assert page.evaluate("window.jobqSamePage") is True
    lines = page.locator("#jobq-logs li").all_inner_texts()
    assert lines[0].endswith("second line") and lines[1].endswith("first line")
    # No new line: the box is left as it is (an operator's selection in it survives the polls).
    page.evaluate("document.getElementById('jobq-logs').jobqMark = 1")
    polls = "Number(document.querySelector('[data-jobq-live]').dataset.jobqPolls || 0)"
    seen = page.evaluate(polls)
    page.wait_for_function(f"{polls} >= {seen + 2}")
    assert page.evaluate("document.getElementById('jobq-logs').jobqMark") == 1
    every_look(page, shots, "byhand-live-logs")
