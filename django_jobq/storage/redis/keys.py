"""Every Redis key django_jobq uses is built here and nowhere else.

All keys of one queue share the hash tag ``{prefix:queue}``, so a queue lives in one Redis
Cluster slot and a Lua script may touch any of them. Scripts that handle many jobs at once get
the *job key prefix* (``{prefix:queue}:job:``) in KEYS and append ids to it: the result carries
the same hash tag, so it is in the same slot as every declared key. Ids and queue names are
validated before they get here (``validation.py``), so neither can break out of the tag.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from ...validation import SEPARATOR, parse_partition


@dataclass(frozen=True, slots=True)
class QueueKeys:
    tag: str  # "{prefix:queue}"

    @classmethod
    def for_queue(cls, prefix: str, queue: str) -> QueueKeys:
        if SEPARATOR in queue:  # a partition of a sharded queue (sharding.py)
            return cls(partition_tag(prefix, queue))
        return cls("{" + f"{prefix}:{queue}" + "}")

    @property
    def job_prefix(self) -> str:
        return f"{self.tag}:job:"

    @property
    def done_prefix(self) -> str:
        return f"{self.tag}:done:"

    def job(self, job_id: str) -> str:
        return self.job_prefix + job_id

    def done(self, job_id: str) -> str:
        """List a finished job's outcome is pushed to, once per registered waiter."""
        return self.done_prefix + job_id

    @property
    def succ_prefix(self) -> str:
        return f"{self.tag}:succ:"

    def succ(self, job_id: str) -> str:
        """HASH: the blocked singleton successor of ``job_id`` (its payload, options, due time
        and order key), waiting for the record under that id to finish."""
        return self.succ_prefix + job_id

    @property
    def dedup_prefix(self) -> str:
        return f"{self.tag}:dedup:"

    def dedup(self, key: str) -> str:
        """STRING ``"<deadline ms>:<holder id>"``: the job holding dedup ``key`` and, for a
        key with a TTL, when it frees (0: when the holder finishes). A PX TTL past the deadline
        only collects it. Dedup keys are validated like job ids, so they stay inside the tag."""
        return self.dedup_prefix + key

    @property
    def group_rate_prefix(self) -> str:
        return f"{self.tag}:grate:"

    def group_rate(self, group: str) -> str:
        """ZSET of one rate-limit group's claims (member id:token -> claim time ms)."""
        return self.group_rate_prefix + group

    @property
    def queued(self) -> str:  # ZSET id -> order score (see queued_score in common.lua)
        return f"{self.tag}:queued"

    @property
    def scheduled(self) -> str:  # ZSET id -> run_at ms (delayed and retrying jobs)
        return f"{self.tag}:scheduled"

    @property
    def active(self) -> str:  # ZSET id -> lease deadline ms
        return f"{self.tag}:active"

    @property
    def wake(self) -> str:  # LIST of at most one marker; idle workers BLPOP it
        return f"{self.tag}:wake"

    def worker_wake(self, worker_id: str) -> str:  # LIST: wakes one worker out of its BLPOP
        return f"{self.tag}:wake:{worker_id}"

    @property
    def seq(self) -> str:  # STRING counter giving FIFO order within a priority
        return f"{self.tag}:seq"

    @property
    def events(self) -> str:  # STREAM of transitions, capped with MAXLEN ~
        return f"{self.tag}:events"

    @property
    def stats(self) -> str:  # HASH of counters: completed, failed, retrying
        return f"{self.tag}:stats"

    @property
    def dead(self) -> str:
        """ZSET of the dead-letter list: ids that failed for good -> when their record expires
        (ms). Scored by expiry so that dropping expired entries is one ZREMRANGEBYSCORE."""
        return f"{self.tag}:dead"

    @property
    def onfail(self) -> str:
        """ZSET of pending failure-handler calls: "<id>:<n>" -> due ms (while leased: the
        lease's end). ``n`` is a per-queue counter (``onfail_seq`` in ``config``), so two
        permanent failures of one id are two calls."""
        return f"{self.tag}:onfail"

    @property
    def onfail_prefix(self) -> str:
        return f"{self.tag}:onfail:"

    def onfail_call(self, member: str) -> str:
        """HASH of one failure call: id, payload, ctype, error, attempts, failed, tries,
        last_error, worker (a copy, independent of the job record's TTL)."""
        return self.onfail_prefix + member

    @property
    def finished_prefix(self) -> str:
        return f"{self.tag}:finished:"

    def finished(self, state: str) -> str:
        """ZSET of the queue's finished records of ``state`` (completed, failed, cancelled)
        -> finish time ms, kept only while the queue has a retention policy for that state:
        the oldest are removed past its count or age (includes/retain.lua)."""
        return self.finished_prefix + state

    @property
    def blocked(self) -> str:  # SET of ids that have a blocked singleton successor
        return f"{self.tag}:blocked"

    @property
    def config(self) -> str:
        """HASH of flow control read by every claim: paused, until (queue-wide postponement,
        ms) and the limits (rate_max, rate_window, group_rate_max, group_rate_window,
        concurrency); an absent field means no limit. Also the failure hook: onfail ("1":
        permanent failures record a failure call) and onfail_seq (the calls' counter), and
        the retention policy: keep:completed, keep:failed, keep:cancelled ("<count>:<age
        ms>", 0 = no bound of that kind; absent or "": none), read by the finishing steps."""
        return f"{self.tag}:config"

    @property
    def rate(self) -> str:  # ZSET of the queue's claims (member id:token -> claim time ms)
        return f"{self.tag}:rate"

    @property
    def capped(self) -> str:
        """STRING flag: a claim stopped at the concurrency cap with jobs left, so the next
        verdict that frees a slot must wake a worker (idle workers then wait without timeout
        hints)."""
        return f"{self.tag}:capped"

    @property
    def generation(self) -> str:
        """STRING: how many times the queue was obliterated, times two, plus one while an
        obliterate runs; the one key obliterate keeps, so that reconcile's re-creations can
        be fenced against it (enqueue.lua, control.lua)."""
        return f"{self.tag}:generation"

    @property
    def everything(self) -> str:
        """Glob pattern (hash tag escaped) of every key of the queue, for obliterate's SCAN."""
        return "".join("\\" + c if c in "*?[]\\" else c for c in self.tag) + ":*"


@dataclass(frozen=True, slots=True)
class GlobalKeys:
    prefix: str

    @property
    def queues(self) -> str:  # SET of queue names ever enqueued to
        return "{" + self.prefix + "}:queues"

    @property
    def workers(self) -> str:  # ZSET worker id -> expiry ms
        return "{" + self.prefix + "}:workers"

    def worker(self, worker_id: str) -> str:  # STRING JSON info, with a TTL
        return "{" + self.prefix + "}:worker:" + worker_id

    @property
    def worker_commands(self) -> str:  # HASH worker id -> JSON command not taken yet
        return "{" + self.prefix + "}:worker-commands"

    @property
    def mirror_gaps(self) -> str:  # HASH queue -> JSON of the mirror's latest gap (a resync)
        return "{" + self.prefix + "}:mirror:gaps"

    @property
    def mirror_sampled(self) -> str:  # HASH queue -> JSON: mirrored as counts and a sample
        return "{" + self.prefix + "}:mirror:sampled"


@lru_cache(maxsize=4096)
def partition_tag(prefix: str, queue: str) -> str:
    """The hash tag of partition ``i`` of ``n``: ``{prefix:queue#s}`` with the smallest
    ``s`` whose slot falls in the ``i``-th of ``n`` equal slot ranges. A cluster made by
    ``redis-cli --cluster create`` gives each master one contiguous, equal range, so the
    partitions of a queue land on as many masters as they can (n = masters: one each);
    plain names would leave it to chance (three hashed names share a master 78 % of the
    time). ``#`` is outside every queue name's charset, so no tag can equal another queue's.
    About ``n`` CRC16 tries, once per process (cached)."""
    parsed = parse_partition(queue)
    if parsed is None:  # validated before it gets here; kept whole rather than guessed
        return "{" + f"{prefix}:{queue}" + "}"
    _, index, count = parsed
    low = index * REDIS_CLUSTER_HASH_SLOTS // count
    high = (index + 1) * REDIS_CLUSTER_HASH_SLOTS // count
    salt = 0
    while True:
        tag = f"{prefix}:{queue}#{salt}"
        if low <= key_slot(tag.encode()) < high:
            return "{" + tag + "}"
        salt += 1
