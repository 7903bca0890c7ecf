--[[ cancel: scheduled / queued / retrying / blocked -> cancelled, O(log n).

KEYS[1] job        HASH
KEYS[2] queued     ZSET
KEYS[3] scheduled  ZSET
KEYS[4] events     STREAM
KEYS[5] stats      HASH
KEYS[6] done       LIST (outcome for waiters)

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] job id

Returns: 'cancelled' (now or already), 'not_found', 'active', 'completed' or 'failed'.
Events: 'cancelled'. The record stays (deduplicating the id) until its result_ttl passes.
]]
--@include common

local job_key, queued_key, scheduled_key = KEYS[1], KEYS[2], KEYS[3]
local events_key, stats_key, done_key = KEYS[4], KEYS[5], KEYS[6]
local state = redis.call('HGET', job_key, 'state')
if not state then return 'not_found' end
if state == 'active' or state == 'completed' or state == 'failed' or state == 'cancelled' then
  return state
end

local now = now_ms(ARGV[1])
if state == 'retrying' then redis.call('HINCRBY', stats_key, 'retrying', -1) end
redis.call('ZREM', queued_key, ARGV[3])
redis.call('ZREM', scheduled_key, ARGV[3])
finish(job_key, done_key, stats_key, 'cancelled', '', now)
emit(events_key, ARGV[2], ARGV[3], 'cancelled', now)
return 'cancelled'
