--[[ release: active -> queued without using an attempt (graceful shutdown), lease holder only.

KEYS[1] job     HASH
KEYS[2] active  ZSET
KEYS[3] queued  ZSET
KEYS[4] wake    LIST
KEYS[5] events  STREAM

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] job id
ARGV[4] fencing token of the caller's claim

Returns: 1 released; 0 lease lost (nothing written).
Events: 'released'. The job keeps its place (its order key) and wakes a worker, which also
covers a claim waiting at the concurrency cap; a blocked successor stays blocked.
]]
--@include common

local job_key, active_key, queued_key, wake_key, events_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local f = redis.call('HMGET', job_key, 'state', 'token', 'worker', 'priority', 'seq', 'lifo')
if f[1] ~= 'active' or f[2] ~= ARGV[4] then return 0 end

local now = now_ms(ARGV[1])
redis.call('HINCRBY', job_key, 'attempts', -1)
redis.call('HSET', job_key, 'state', 'queued')
redis.call('ZREM', active_key, ARGV[3])
redis.call('ZADD', queued_key, queued_score(f[4], f[5], f[6]), ARGV[3])
emit(events_key, ARGV[2], ARGV[3], 'released', now, f[3])
wake(wake_key)
return 1
