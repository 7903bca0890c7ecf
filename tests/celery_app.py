"""A real Celery app for the interoperability tests: it sends tasks to the bridge, reads their
results with AsyncResult, and runs as a real worker (``celery -A tests.celery_app worker``)
for messages django_jobq publishes."""

import os

from celery import Celery

BROKER = os.environ.get("JOBQ_TEST_CELERY_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
RESULTS = os.environ.get("JOBQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def make_app(broker: str = BROKER) -> Celery:
    app = Celery("jobqtests", broker=broker, backend=RESULTS)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_expires=600,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
    )
    return app


app = make_app()


@app.task(name="tests.celery_side.mul")
def mul(x, y):
    return x * y


@app.task(name="tests.celery_side.greet")
def greet(name, punctuation="!"):
    return f"hello {name}{punctuation}"
