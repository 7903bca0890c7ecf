--[[ change: a waiting job's due time and/or priority, in one atomic step.

KEYS[1] job        HASH
KEYS[2] queued     ZSET
KEYS[3] scheduled  ZSET
KEYS[4] stats      HASH (the retrying count)
KEYS[5] wake       LIST
KEYS[6] events     STREAM
KEYS[7] successor  HASH (the id's blocked singleton successor, if any)

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] job id
ARGV[4] run_at (epoch ms; '' = unchanged)
ARGV[5] priority ('' = unchanged)

The record is changed when it is scheduled, queued or retrying, else its blocked successor
when it has one (the change applies when the successor is released). A new priority takes
effect at once for a queued job, at the place its order key gives; run_at <= now makes the job
queued, later makes it scheduled (a retrying job stays retrying).
Returns: 'changed', or why not: 'not_found', 'active', 'completed', 'failed', 'cancelled'.
Events: 'queued', 'scheduled' or 'retrying' when the due time moves.
]]
--@include common
--@include sched

local job_key, queued_key, scheduled_key = KEYS[1], KEYS[2], KEYS[3]
local succ_key = KEYS[7]
local id, run_at, priority = ARGV[3], ARGV[4], ARGV[5]
local f = redis.call('HMGET', job_key, 'state', 'succ')
local state = f[1]
if not state then return 'not_found' end
local now = now_ms(ARGV[1])
local h = sched()

if h.WAITING[state] then
  if priority ~= '' then
    redis.call('HSET', job_key, 'priority', priority)
    if state == 'queued' then h.index_queued(queued_key, job_key, id) end
  end
  if run_at ~= '' then
    local k = { queued = queued_key, scheduled = scheduled_key, stats = KEYS[4],
      wake = KEYS[5], events = KEYS[6], maxlen = ARGV[2] }
    h.move_due(k, job_key, id, state, tonumber(run_at), now)
  end
  return 'changed'
end
if f[2] == '1' then
  if priority ~= '' then redis.call('HSET', succ_key, 'priority', priority) end
  if run_at ~= '' then redis.call('HSET', succ_key, 'due', fmt(tonumber(run_at))) end
  return 'changed'
end
return state
