--[[ fail: active -> retrying (backoff pending) or -> failed, for the lease holder only.

KEYS[1] job     HASH
KEYS[2] active  ZSET
KEYS[3] stats   HASH
KEYS[4] done    LIST (outcome for waiters)
KEYS[5] capped  STRING flag (a claim waits for a free concurrency slot)
KEYS[6..13] settle keys: job prefix, successor prefix, dedup prefix, blocked SET, queued,
        scheduled, wake, events (see settle_keys in common.lua)
KEYS[14] dead   ZSET (the dead-letter list: id -> record expiry ms)
KEYS[15] config HASH (its 'onfail' flag: record a failure-handler call)
KEYS[16] onfail ZSET of pending failure calls; KEYS[17] their HASH key prefix
KEYS[18] finished-index prefix (retention, see includes/retain.lua)

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] job id
ARGV[4] fencing token of the caller's claim
ARGV[5] error (JSON bytes)
ARGV[6] retry delay (ms from now, by this script's clock) used when the job may retry
ARGV[7] permanent (1 = no further attempts)
ARGV[8] 'cancelled' when an operator cancelled the running attempt (ends it cancelled, not
        failed: no retry, no dead letter), else ''

Returns: 2 failed for good; 3 retrying; 4 cancelled; 0 lease lost (nothing written).
Events: 'retrying', 'failed' or 'cancelled'. A retry wakes idle workers so they re-read the next due time.
Failed for good settles the job like complete.lua (dedup key freed, successor released) and
puts it on the dead-letter list (unless a successor took the id over) and, when the queue's
failure hook is on, records a failure-handler call (see record_failure in common.lua); a
retrying job keeps both (and is not subject to retention): it is not finished, and its successor must not run beside it.
]]
--@include common
--@include sched
--@include retain

local job_key, active_key, stats_key, done_key, capped_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local scheduled_key, wake_key, events_key = KEYS[11], KEYS[12], KEYS[13]
local f = redis.call('HMGET', job_key, 'state', 'token', 'worker', 'attempts', 'max_attempts',
  'succ', 'dedup', 'dmode')
if f[1] ~= 'active' or f[2] ~= ARGV[4] then return 0 end

local now = now_ms(ARGV[1])
local id = ARGV[3]
redis.call('HSET', job_key, 'error', ARGV[5])
redis.call('ZREM', active_key, id)
-- A claim stopped at the concurrency cap with jobs left: the slot freed now is claimable.
if redis.call('DEL', capped_key) == 1 then wake(wake_key) end
local final = ARGV[8] == 'cancelled' and 'cancelled' or 'failed'
if final == 'cancelled' or ARGV[7] == '1' or tonumber(f[4]) >= tonumber(f[5]) then
  finish(job_key, done_key, stats_key, final, ARGV[5], now)
  emit(events_key, ARGV[2], id, final, now, f[3], ARGV[5])
  if final == 'failed' then record_failure(job_key, KEYS[15], KEYS[16], KEYS[17], id, now) end
  if f[6] or f[7] then
    local h = sched()
    h.settle(h.settle_keys(KEYS, 6), ARGV[2], id, f[6], f[7], f[8], now)
  end
  bury(job_key, KEYS[14], id, now)
  if f[6] ~= '1' then  -- else a successor holds the id now: nothing finished to keep
    keep_finished(retention(KEYS[15], KEYS[18], KEYS[6], KEYS[14], events_key, ARGV[2]),
      final, id, now)
  end
  if final == 'cancelled' then return 4 end
  return 2
end

local retry_at = now + math.max(tonumber(ARGV[6]), 0)
redis.call('HSET', job_key, 'state', 'retrying', 'run_at', fmt(retry_at))
redis.call('HINCRBY', stats_key, 'retrying', 1)
redis.call('ZADD', scheduled_key, retry_at, id)
emit(events_key, ARGV[2], id, 'retrying', now, f[3], ARGV[5])
wake(wake_key)
return 3
