"""Throughput of the kombu bridge: Celery messages in the broker -> jobs stored in Redis.

    python -m bench.celery_bridge [--messages 5000] [--broker amqp://guest:guest@127.0.0.1:5672//]

N messages are sent with a real Celery app (``send_task``, before timing) to a queue of this
run's own; then one in-process ``KombuBridge`` consumes them into the Redis backend. Prints one
JSON object: messages/s from the bridge's start to the last job stored, and the same broker's
raw consume-and-ack rate with kombu (no storage) for comparison in the same run.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

from bench.core import delete_matching, log, redis_client, run_pattern, setup_django


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--broker", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--prefetch", type=int, default=100)
    args = parser.parse_args()
    prefix = f"jobqbench-{uuid.uuid4().hex[:10]}"
    setup_django(prefix)

    from django.test import override_settings
    from kombu import Connection, Exchange
    from kombu import Queue as KombuQueue

    from django_jobq.backend import get_storage
    from django_jobq.contrib.celery import celery_settings
    from django_jobq.contrib.celery.bridge import KombuBridge, bridge_thread
    from tests.celery_app import make_app

    app = make_app(args.broker)
    storage = get_storage()
    queue = f"{prefix}-celery"
    routes = {**celery_settings(), "ROUTES": {"bench.noop": "bench"}}
    from django.conf import settings

    out: dict = {"messages": args.messages, "broker": args.broker.split("@")[-1]}
    try:
        # Reference: the broker's own consume+ack rate, same client library, no storage.
        log(f"sending {args.messages} messages (reference run)")
        for i in range(args.messages):
            app.send_task("bench.noop", (i,), queue=queue)
        kq = KombuQueue(queue, Exchange(queue, type="direct"), routing_key=queue)
        seen = 0
        with Connection(args.broker) as conn:

            def ack(message):
                nonlocal seen
                message.ack()
                seen += 1

            start = time.perf_counter()
            with conn.Consumer([kq], on_message=ack, prefetch_count=args.prefetch):
                while seen < args.messages:
                    conn.drain_events(timeout=10)
            out["kombu_consume_ack_per_s"] = round(args.messages / (time.perf_counter() - start))

        log(f"sending {args.messages} messages (bridge run)")
        for i in range(args.messages):
            app.send_task("bench.noop", (i,), queue=queue)
        with override_settings(JOBQ={**settings.JOBQ, "CELERY": routes}):
            bridge = KombuBridge(args.broker, [queue], storage=storage, prefetch=args.prefetch)
            start = time.perf_counter()
            thread = bridge_thread(bridge)
            while bridge.counts["queued"] + bridge.counts["duplicate"] < args.messages:
                time.sleep(0.005)
            elapsed = time.perf_counter() - start
            bridge.stop()
            thread.join(10)
        out["bridge_per_s"] = round(args.messages / elapsed)
        out["bridge_vs_kombu"] = round(out["bridge_per_s"] / out["kombu_consume_ack_per_s"], 3)
        out["counts"] = bridge.counts
    finally:
        with Connection(args.broker) as conn:
            conn.default_channel.queue_delete(queue)
            conn.default_channel.exchange_delete(queue)
        deleted = delete_matching(redis_client(), run_pattern(prefix))
        log(f"deleted {deleted} keys of {prefix}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
