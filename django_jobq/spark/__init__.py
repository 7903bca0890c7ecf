"""The data pipeline on Apache Spark: history export, analytics, bulk enqueue from DataFrames.

An optional extra: ``pip install 'django-jobq[spark]'`` (PySpark 4, pandas, pyarrow, and a Java
17+ runtime on the machine). Nothing outside this package imports PySpark, and the management
commands import it only when they run, so a project without the extra loses nothing else.
"""

from __future__ import annotations

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "django_jobq.spark needs the 'spark' extra: pip install 'django-jobq[spark]' "
        f"(missing: {exc.name})"
    ) from exc

from .analytics import run_analytics
from .enqueue import EnqueueCounts, enqueue_dataframe
from .export import export_history
from .session import get_spark

__all__ = ["EnqueueCounts", "enqueue_dataframe", "export_history", "get_spark", "run_analytics"]
