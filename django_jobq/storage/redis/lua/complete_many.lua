--[[ complete_many: several `complete` transitions in one call (a worker's ack batch).

Each job is handled exactly as complete.lua does it: lease-checked on its own, result stored,
record set to expire, waiters told, one 'completed' event. Batching only saves round trips and
per-call overhead; a stale token fails that job alone.

KEYS[1] job key prefix   ("{prefix:queue}:job:", ids appended: same hash tag)
KEYS[2] done key prefix  ("{prefix:queue}:done:")
KEYS[3] active  ZSET
KEYS[4] events  STREAM
KEYS[5] stats   HASH

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3..] triples: job id, fencing token, result bytes

Returns: one integer per job, in order: 1 completed; 0 lease lost (nothing written).
]]
--@include common

local job_prefix, done_prefix, active_key, events_key, stats_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = now_ms(ARGV[1])
local out = {}
for i = 3, #ARGV, 3 do
  local id, token, result = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local job_key = job_prefix .. id
  local f = redis.call('HMGET', job_key, 'state', 'token', 'worker')
  if f[1] ~= 'active' or f[2] ~= token then
    out[#out + 1] = 0
  else
    redis.call('HSET', job_key, 'result', result)
    redis.call('ZREM', active_key, id)
    finish(job_key, done_prefix .. id, stats_key, 'completed', result, now)
    emit(events_key, ARGV[2], id, 'completed', now, f[3])
    out[#out + 1] = 1
  end
end
return out
