--[[ retry: failed / cancelled -> queued again (an operator's "run it again").

KEYS[1] job     HASH
KEYS[2] queued  ZSET
KEYS[3] dead    ZSET (the dead-letter list)
KEYS[4] wake    LIST
KEYS[5] events  STREAM
KEYS[6] finished-index prefix (retention): the record leaves its state's index
KEYS[7] stats   HASH: the job leaves its final state's count (counts() counts jobs, not
        finishes: a job failed, retried and failed again is one failed job)

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] job id

Returns: 'retried', or why not: 'not_found', 'waiting' (scheduled, queued, retrying),
'active', 'completed'.
Events: 'retried'.
The record stops expiring, attempts and stalls restart from 0, the last error, result,
progress and finish time go (its log lines stay), and the job takes its old place in line (its order key is kept). A dedup key
it held was freed when it ended and is not taken again.
]]
--@include common

local job_key, queued_key, dead_key, wake_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
  KEYS[5]
local id = ARGV[3]
local f = redis.call('HMGET', job_key, 'state', 'priority', 'seq', 'lifo')
local state = f[1]
if not state then return 'not_found' end
if state == 'active' or state == 'completed' then return state end
if state ~= 'failed' and state ~= 'cancelled' then return 'waiting' end

local now = now_ms(ARGV[1])
redis.call('PERSIST', job_key)
redis.call('HSET', job_key, 'state', 'queued', 'attempts', 0, 'stalls', 0)
redis.call('HDEL', job_key, 'error', 'result', 'finished', 'run_at', 'progress', 'cancel')
redis.call('ZADD', queued_key, queued_score(f[2], f[3], f[4]), id)
redis.call('ZREM', dead_key, id)
redis.call('ZREM', KEYS[6] .. state, id)
if tonumber(redis.call('HGET', KEYS[7], state) or '0') > 0 then
  redis.call('HINCRBY', KEYS[7], state, -1)
end
emit(events_key, ARGV[2], id, 'retried', now)
wake(wake_key)
return 'retried'
