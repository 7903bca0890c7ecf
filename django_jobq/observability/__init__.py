"""What operators watch: OpenTelemetry tracing (``tracing.py``, ``fastpath.py``; extra
``otel``), JSON logs (``logs.py``) and Prometheus metrics (``metrics/``; extra ``metrics``).
Each part imports its optional library only when it is used."""
