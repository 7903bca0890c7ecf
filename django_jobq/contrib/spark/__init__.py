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

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .analytics import run_analytics
    from .enqueue import EnqueueCounts, enqueue_dataframe
    from .export import export_history
    from .session import get_spark

# Loaded on first use: executors unpickle ``enqueue`` functions before Django is set up there,
# and importing this package must not import the models at that point.
_EXPORTS = {
    "EnqueueCounts": "enqueue",
    "enqueue_dataframe": "enqueue",
    "export_history": "export",
    "get_spark": "session",
    "run_analytics": "analytics",
}
__all__ = ["EnqueueCounts", "enqueue_dataframe", "export_history", "get_spark", "run_analytics"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
