--[[ complete: active -> completed, only for the holder of the current lease.

KEYS[1] job     HASH
KEYS[2] active  ZSET
KEYS[3] stats   HASH
KEYS[4] done    LIST (outcome for waiters)
KEYS[5] capped  STRING flag (a claim waits for a free concurrency slot)
KEYS[6..13] settle keys: job prefix, successor prefix, dedup prefix, blocked SET, queued,
        scheduled, wake, events (see settle_keys in common.lua)
KEYS[14] dead   ZSET; KEYS[15] config HASH; KEYS[16] finished-index prefix (retention,
        see includes/retain.lua)

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] job id
ARGV[4] fencing token of the caller's claim
ARGV[5] result bytes

Returns: 1 completed; 0 lease lost (state not active or token stale: nothing written).
Events: 'completed'. The record expires after its result_ttl; waiters get 'completed\n<result>'.
In the same step the queue's retention policy is applied ('removed' events) and a simple-mode dedup key held by the job is freed and a blocked singleton
successor replaces the record ('queued' or 'scheduled' event).
]]
--@include common
--@include sched
--@include retain

local job_key, active_key, stats_key, done_key, capped_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local wake_key, events_key = KEYS[12], KEYS[13]
local f = redis.call('HMGET', job_key, 'state', 'token', 'worker', 'succ', 'dedup', 'dmode',
  'ctype')
if f[1] ~= 'active' or f[2] ~= ARGV[4] then return 0 end

local now = now_ms(ARGV[1])
local id = ARGV[3]
redis.call('HSET', job_key, 'result', ARGV[5])
redis.call('ZREM', active_key, id)
finish(job_key, done_key, stats_key, 'completed', ARGV[5], now)
emit(events_key, ARGV[2], id, 'completed', now, f[3], ARGV[5], f[7])
if f[4] or f[5] then
  local h = sched()
  h.settle(h.settle_keys(KEYS, 6), ARGV[2], id, f[4], f[5], f[6], now)
end
if f[4] ~= '1' then  -- else a successor holds the id now: nothing finished to keep
  keep_finished(retention(KEYS[15], KEYS[16], KEYS[6], KEYS[14], events_key, ARGV[2]),
    'completed', id, now)
end
-- A claim stopped at the concurrency cap with jobs left: the slot freed now is claimable.
if redis.call('DEL', capped_key) == 1 then wake(wake_key) end
return 1
