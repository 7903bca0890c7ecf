--[[ complete_many: several `complete` transitions in one call (a worker's ack batch).

Each job is handled exactly as complete.lua does it: lease-checked on its own, result stored,
record set to expire, waiters told, one 'completed' event, its dedup key and successor
settled, the queue's retention applied. Batching only saves round trips and per-call overhead; a stale token fails that job
alone.

KEYS[1] done key prefix  ("{prefix:queue}:done:", ids appended: same hash tag)
KEYS[2] active  ZSET
KEYS[3] stats   HASH
KEYS[4] capped  STRING flag (a claim waits for a free concurrency slot)
KEYS[5..12] settle keys: job prefix, successor prefix, dedup prefix, blocked SET, queued,
        scheduled, wake, events (see settle_keys in common.lua)
KEYS[13] dead   ZSET; KEYS[14] config HASH; KEYS[15] finished-index prefix (retention,
        see includes/retain.lua)

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3..] triples: job id, fencing token, result bytes

Returns: one integer per job, in order: 1 completed; 0 lease lost (nothing written).
]]
--@include common
--@include sched
--@include retain

local done_prefix, active_key, stats_key, capped_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local job_prefix, wake_key, events_key, maxlen = KEYS[5], KEYS[11], KEYS[12], ARGV[2]
local now = now_ms(ARGV[1])
local r = retention(KEYS[14], KEYS[15], job_prefix, KEYS[13], events_key, maxlen)
local out = {}
local freed = false
for i = 3, #ARGV, 3 do
  local id, token, result = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local job_key = job_prefix .. id
  local f = redis.call('HMGET', job_key, 'state', 'token', 'worker', 'succ', 'dedup', 'dmode',
    'result_ttl', 'waiters', 'ctype')
  if f[1] ~= 'active' or f[2] ~= token then
    out[#out + 1] = 0
  else
    redis.call('ZREM', active_key, id)
    finish_read(job_key, done_prefix .. id, stats_key, 'completed', result, now, f[7], f[8],
      'result', result)
    emit(events_key, maxlen, id, 'completed', now, f[3], result, f[9])
    if f[4] or f[5] then
      local h = sched()
      h.settle(h.settle_keys(KEYS, 5), maxlen, id, f[4], f[5], f[6], now)
    end
    if f[4] ~= '1' then keep_finished(r, 'completed', id, now) end
    out[#out + 1] = 1
    freed = true
  end
end
-- A claim stopped at the concurrency cap with jobs left: the slots freed now are claimable.
if freed and redis.call('DEL', capped_key) == 1 then wake(wake_key) end
return out
