--[[ complete: active -> completed, only for the holder of the current lease.

KEYS[1] job     HASH
KEYS[2] active  ZSET
KEYS[3] events  STREAM
KEYS[4] stats   HASH
KEYS[5] done    LIST (outcome for waiters)

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] job id
ARGV[4] fencing token of the caller's claim
ARGV[5] result bytes

Returns: 1 completed; 0 lease lost (state not active or token stale: nothing written).
Events: 'completed'. The record expires after its result_ttl; waiters get 'completed\n<result>'.
]]
--@include common

local job_key, active_key, events_key, stats_key, done_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local f = redis.call('HMGET', job_key, 'state', 'token', 'worker')
if f[1] ~= 'active' or f[2] ~= ARGV[4] then return 0 end

local now = now_ms(ARGV[1])
redis.call('HSET', job_key, 'result', ARGV[5])
redis.call('ZREM', active_key, ARGV[3])
finish(job_key, done_key, stats_key, 'completed', ARGV[5], now)
emit(events_key, ARGV[2], ARGV[3], 'completed', now, f[3])
return 1
