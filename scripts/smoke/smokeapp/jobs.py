"""One handler, autodiscovered from the installed package like a user's would be."""

from django_jobq import handler


@handler("smoke")
def add(job):
    return {"sum": job.payload["a"] + job.payload["b"]}
