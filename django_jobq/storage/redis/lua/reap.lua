--[[ reap: recover stalled jobs and promote due ones, in one atomic step per batch.

KEYS[1] job key prefix  "{p:q}:job:"
KEYS[2] done key prefix "{p:q}:done:"
KEYS[3] active          ZSET id -> lease deadline
KEYS[4] queued          ZSET
KEYS[5] scheduled       ZSET
KEYS[6] wake            LIST
KEYS[7] events          STREAM
KEYS[8] stats           HASH

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] limit (jobs per category and call)

Returns: { promoted count, requeued count, requeued ids..., failed ids... }
Events: 'stalled' for a job put back in the queue (stalls + 1, same place in line), 'failed'
for one past max_stalls (waiters told), 'queued' for each promoted job.
Result expiry needs no work here: finished records carry a Redis TTL.
]]
--@include common

local job_prefix, done_prefix, active_key, queued_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local scheduled_key, wake_key, events_key, stats_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local now = now_ms(ARGV[1])
local maxlen, limit = ARGV[2], tonumber(ARGV[3])
local stalled_error = '{"type":"Stalled","message":"lease expired more than max_stalls times"}'

local requeued, failed = {}, {}
local expired = redis.call('ZRANGEBYSCORE', active_key, '-inf', fmt(now), 'LIMIT', 0, limit)
for _, id in ipairs(expired) do
  local job_key = job_prefix .. id
  redis.call('ZREM', active_key, id)
  local f = redis.call('HMGET', job_key, 'state', 'stalls', 'max_stalls', 'priority', 'seq')
  if f[1] == 'active' then
    local stalls = redis.call('HINCRBY', job_key, 'stalls', 1)
    if stalls > tonumber(f[3]) then
      redis.call('HSET', job_key, 'error', stalled_error)
      finish(job_key, done_prefix .. id, stats_key, 'failed', stalled_error, now)
      emit(events_key, maxlen, id, 'failed', now)
      table.insert(failed, id)
    else
      -- A stalled run reached no verdict: like a release it costs no attempt (stalls count it).
      redis.call('HINCRBY', job_key, 'attempts', -1)
      redis.call('HSET', job_key, 'state', 'queued')
      redis.call('ZADD', queued_key, queued_score(f[4], f[5]), id)
      emit(events_key, maxlen, id, 'stalled', now)
      table.insert(requeued, id)
    end
  end
end

local promoted = promote_due(job_prefix, scheduled_key, queued_key, stats_key, events_key,
  maxlen, now, limit)
if #requeued > 0 or promoted > 0 then wake(wake_key) end

local out = { promoted, #requeued }
for _, id in ipairs(requeued) do table.insert(out, id) end
for _, id in ipairs(failed) do table.insert(out, id) end
return out
