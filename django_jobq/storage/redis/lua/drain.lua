--[[ drain: cancel waiting jobs in batches, each job exactly as cancel.lua would.

KEYS[1] done key prefix "{p:q}:done:"
KEYS[2] stats           HASH
KEYS[3..10] settle keys: job prefix, successor prefix, dedup prefix, blocked SET, queued,
        scheduled, wake, events (see settle_keys in common.lua)
KEYS[11] dead   ZSET; KEYS[12] config HASH; KEYS[13] finished-index prefix (retention,
        see includes/retain.lua)

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] delayed (1 = scheduled and retrying jobs and blocked successors too)
ARGV[4] limit (jobs cancelled at most by this call; the caller calls again while it is hit)

Returns: { jobs cancelled (successors included), 1 if the limit was hit else 0 }
Events: 'cancelled' per job (per id for a successor). Waiters are told, records expire after
their result TTL, simple-mode dedup keys are freed, the queue's retention applies. A queued job whose successor is kept
(delayed = 0) gives its id to the successor, as any finished job does.
]]
--@include common
--@include sched
--@include retain

local done_prefix, stats_key = KEYS[1], KEYS[2]
local h = sched()
local s = h.settle_keys(KEYS, 3)
local now = now_ms(ARGV[1])
local maxlen, delayed, limit = ARGV[2], ARGV[3] == '1', tonumber(ARGV[4])
local n = 0
local r = retention(KEYS[12], KEYS[13], s.job_prefix, KEYS[11], s.events, maxlen)

local function drop_successor(id)
  redis.call('DEL', s.succ_prefix .. id)
  redis.call('HDEL', s.job_prefix .. id, 'succ')
  redis.call('SREM', s.blocked, id)
  n = n + 1
end

local function cancel(id)
  local job_key = s.job_prefix .. id
  local f = redis.call('HMGET', job_key, 'state', 'succ', 'dedup', 'dmode')
  redis.call('ZREM', s.queued, id)
  redis.call('ZREM', s.scheduled, id)
  if not h.WAITING[f[1]] then return end  -- an index entry without a live waiting record
  if f[1] == 'retrying' then redis.call('HINCRBY', stats_key, 'retrying', -1) end
  if f[2] == '1' and delayed then drop_successor(id) end
  finish(job_key, done_prefix .. id, stats_key, 'cancelled', '', now)
  emit(s.events, maxlen, id, 'cancelled', now)
  n = n + 1
  if delayed then f[2] = nil end
  h.settle(s, maxlen, id, f[2], f[3], f[4], now)
  if f[2] ~= '1' then keep_finished(r, 'cancelled', id, now) end
end

for _, id in ipairs(redis.call('ZRANGE', s.queued, 0, limit - 1)) do cancel(id) end
if delayed and n < limit then
  for _, id in ipairs(redis.call('ZRANGE', s.scheduled, 0, limit - n - 1)) do cancel(id) end
end
if delayed and n < limit then
  for _, id in ipairs(redis.call('SRANDMEMBER', s.blocked, limit - n)) do
    drop_successor(id)
    emit(s.events, maxlen, id, 'cancelled', now)
  end
end
local more = 0
if n >= limit then more = 1 end
return { n, more }
