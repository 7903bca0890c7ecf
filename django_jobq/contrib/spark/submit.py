"""A driver script for ``spark-submit``: runs ``jobq_analytics`` with spark-submit's master and
settings.

    spark-submit --master spark://host:7077 [spark options] \\
        "$(python -c 'import django_jobq.contrib.spark.submit as s; print(s.__file__)')" \\
        --input /shared/jobq-history [other jobq_analytics options]

Needs ``DJANGO_SETTINGS_MODULE`` (and ``PYTHONPATH`` naming the project when it is not
installed): spark-submit runs this file as a script, outside ``manage.py``.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> None:
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        raise SystemExit("set DJANGO_SETTINGS_MODULE (and PYTHONPATH) for the driver")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("jobq_analytics", *argv)


if __name__ == "__main__":
    main(sys.argv[1:])
