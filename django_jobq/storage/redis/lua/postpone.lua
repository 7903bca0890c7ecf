--[[ postpone: the handler is rate limited: active -> scheduled, due now + delay, without using
an attempt; lease holder only. Optionally the whole queue claims nothing until then.

KEYS[1] job        HASH
KEYS[2] active     ZSET
KEYS[3] scheduled  ZSET
KEYS[4] wake       LIST
KEYS[5] events     STREAM
KEYS[6] config     HASH (field 'until': queue-wide postponement, read by claim.lua)
KEYS[7] capped     STRING flag (a claim waits for a free concurrency slot)

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] job id
ARGV[4] fencing token of the caller's claim
ARGV[5] delay (ms from now, by this script's clock)
ARGV[6] queue-wide (1 = the queue claims nothing until now + delay; a later 'until' stays)

Returns: 1 postponed; 0 lease lost (nothing written).
Events: 'postponed'. The job keeps its order key and a blocked successor (it is not finished).
]]
--@include common

local job_key, active_key, scheduled_key, wake_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local events_key, config_key, capped_key = KEYS[5], KEYS[6], KEYS[7]
local f = redis.call('HMGET', job_key, 'state', 'token', 'worker')
if f[1] ~= 'active' or f[2] ~= ARGV[4] then return 0 end

local now = now_ms(ARGV[1])
local id = ARGV[3]
local due = now + math.max(tonumber(ARGV[5]), 0)
redis.call('HINCRBY', job_key, 'attempts', -1)
redis.call('HSET', job_key, 'state', 'scheduled', 'run_at', fmt(due))
redis.call('ZREM', active_key, id)
redis.call('ZADD', scheduled_key, due, id)
if ARGV[6] == '1' then
  local current = tonumber(redis.call('HGET', config_key, 'until') or '0')
  if due > current then redis.call('HSET', config_key, 'until', fmt(due)) end
end
emit(events_key, ARGV[2], id, 'postponed', now, f[3])
redis.call('DEL', capped_key)
wake(wake_key)  -- the freed slot, and idle workers re-read the next due time
return 1
