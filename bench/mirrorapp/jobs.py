"""The no-op handler the mirror benchmark's worker drains."""

from django_jobq import handler


@handler("mirrorbench")
def noop(job):
    return None
