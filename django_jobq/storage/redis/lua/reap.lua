--[[ reap: recover stalled jobs and promote due ones, in one atomic step per batch.

KEYS[1] done key prefix "{p:q}:done:"
KEYS[2] active          ZSET id -> lease deadline
KEYS[3] stats           HASH
KEYS[4] capped          STRING flag (a claim waits for a free concurrency slot)
KEYS[5..12] settle keys: job prefix, successor prefix, dedup prefix, blocked SET, queued,
        scheduled, wake, events (see settle_keys in common.lua)
KEYS[13] dead           ZSET (the dead-letter list: id -> record expiry ms)
KEYS[14] config         HASH (its 'onfail' flag: record a failure-handler call)
KEYS[15] onfail         ZSET of pending failure calls; KEYS[16] their HASH key prefix
KEYS[17] finished-index prefix (retention, see includes/retain.lua)

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] limit (jobs per category and call)

Returns: { promoted count, requeued count, requeued ids..., failed ids... }
Events: 'stalled' for a job put back in the queue (stalls + 1, same place in line), 'failed'
for one past max_stalls (waiters told; settled like complete.lua: dedup key freed, blocked
successor released, put on the dead-letter list, a failure-handler call recorded when the
queue's hook is on), 'queued' for each promoted job.
Result expiry needs no work here: finished records carry a Redis TTL; dead-letter entries whose
record expired are dropped here.
]]
--@include common
--@include sched
--@include retain
--@include spec

local done_prefix, active_key, stats_key, capped_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local job_prefix, queued_key, scheduled_key = KEYS[5], KEYS[9], KEYS[10]
local wake_key, events_key = KEYS[11], KEYS[12]
local now = now_ms(ARGV[1])
local maxlen, limit = ARGV[2], tonumber(ARGV[3])

local r = nil  -- the retention policy, read at the first job that fails here
local requeued, failed = {}, {}
local expired = redis.call('ZRANGEBYSCORE', active_key, '-inf', fmt(now), 'LIMIT', 0, limit)
for _, id in ipairs(expired) do
  local job_key = job_prefix .. id
  redis.call('ZREM', active_key, id)
  local f = redis.call('HMGET', job_key, 'state', 'stalls', 'max_stalls', 'priority', 'seq',
    'lifo', 'succ', 'dedup', 'dmode')
  if f[1] == 'active' then
    local stalls = redis.call('HINCRBY', job_key, 'stalls', 1)
    if stalls > tonumber(f[3]) then
      redis.call('HSET', job_key, 'error', STALLED_ERROR)
      finish(job_key, done_prefix .. id, stats_key, 'failed', STALLED_ERROR, now)
      emit(events_key, maxlen, id, 'failed', now, nil, STALLED_ERROR)
      record_failure(job_key, KEYS[14], KEYS[15], KEYS[16], id, now)
      if f[7] or f[8] then
        local h = sched()
        h.settle(h.settle_keys(KEYS, 5), maxlen, id, f[7], f[8], f[9], now)
      end
      bury(job_key, KEYS[13], id, now)
      if f[7] ~= '1' then
        r = r or retention(KEYS[14], KEYS[17], job_prefix, KEYS[13], events_key, maxlen)
        keep_finished(r, 'failed', id, now)
      end
      table.insert(failed, id)
    else
      -- A stalled run reached no verdict: like a release it costs no attempt (stalls count it).
      redis.call('HINCRBY', job_key, 'attempts', -1)
      redis.call('HSET', job_key, 'state', 'queued')
      redis.call('ZADD', queued_key, queued_score(f[4], f[5], f[6]), id)
      emit(events_key, maxlen, id, 'stalled', now)
      table.insert(requeued, id)
    end
  end
end

redis.call('ZREMRANGEBYSCORE', KEYS[13], '-inf', fmt(now))
local promoted = promote_due(job_prefix, scheduled_key, queued_key, stats_key, events_key,
  maxlen, now, limit)
if #expired > 0 then redis.call('DEL', capped_key) end
if #requeued > 0 or #failed > 0 or promoted > 0 then wake(wake_key) end

local out = { promoted, #requeued }
for _, id in ipairs(requeued) do table.insert(out, id) end
for _, id in ipairs(failed) do table.insert(out, id) end
return out
