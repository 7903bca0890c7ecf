"""Periodic jobs: validating and firing ``Schedule`` rows (``core.py``), cron expressions
(``cron.py``) and the schedules declared in ``JOBQ["SCHEDULES"]`` kept in step with the rows
(``sync.py``). Importing the package registers the rows' save hook (``apps.py``)."""

from .core import validate_schedule

__all__ = ["validate_schedule"]
