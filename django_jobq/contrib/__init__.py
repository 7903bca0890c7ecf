"""Bridges to other systems, each an optional extra imported only when used: Celery and kombu
(``celery/``), Django's Tasks framework (``tasks_backend.py``) and Apache Spark
(``spark/``)."""
