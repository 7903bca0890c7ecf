--[[ enqueue_one: store one new job that uses no scheduling option (no lifo, group, singleton,
update or dedup), deduplicated by id: the one-call-per-job path of Queue.enqueue.

The rules are enqueue.lua's for such a job, with its arguments in the same layout (KEYS, then
ARGV: now, events MAXLEN, 1, one option set of ten items, id, payload, "1"), so a call of this
script gives what the same call of enqueue.lua gives. It exists because a script's whole chunk
runs on every call: enqueue.lua's loop, set table and scheduling rules cost a lone job about a
fifth of its server time, and this path is the one measured against a PING.

KEYS[1] job key prefix, KEYS[2] queued, KEYS[3] scheduled, KEYS[4] wake, KEYS[5] seq,
KEYS[6] events (KEYS[7..10] as enqueue.lua's, unused here)

Returns code, state, result, error, as enqueue.lua does for one job (codes 1, 2, 3).
]]
--@include common

local id, payload = ARGV[14], ARGV[15]
local job_key = KEYS[1] .. id
local existing = redis.call('HMGET', job_key, 'state', 'result', 'error')
local state = existing[1]
local waiter = ARGV[12] == '1'
if state then
  local code = 2
  if state == 'completed' then code = 3 end
  if waiter and code ~= 3 and state ~= 'blocked' and state ~= 'failed'
      and state ~= 'cancelled' then
    redis.call('HINCRBY', job_key, 'waiters', 1)
  end
  return { code, state, existing[2] or false, existing[3] or false }
end
local now = now_ms(ARGV[1])
local seq = redis.call('INCR', KEYS[5])
local run_at = math.max(tonumber(ARGV[11]), now + tonumber(ARGV[13]))
state = 'queued'
if run_at > now then state = 'scheduled' end
redis.call('HSET', job_key,
  'state', state, 'payload', payload, 'ctype', ARGV[4],
  'max_attempts', ARGV[5], 'result_ttl', ARGV[6],
  'min_backoff', ARGV[7], 'max_backoff', ARGV[8],
  'max_stalls', ARGV[9], 'priority', ARGV[10], 'seq', seq,
  'created', fmt(now))
if waiter then redis.call('HSET', job_key, 'waiters', 1) end
if state == 'scheduled' then
  redis.call('HSET', job_key, 'run_at', fmt(run_at))
  wake_if_earliest(KEYS[3], KEYS[4], run_at)
  redis.call('ZADD', KEYS[3], run_at, id)
else
  redis.call('ZADD', KEYS[2], queued_score(ARGV[10], seq, nil), id)
end
emit(KEYS[6], ARGV[2], id, state, now)
if state == 'queued' then wake(KEYS[4]) end
return { 1, state, false, false }
