--[[ enqueue: store one or more new jobs, deduplicated by id, in one atomic step.

KEYS[1] job key prefix  "{p:q}:job:"
KEYS[2] queued          ZSET
KEYS[3] scheduled       ZSET
KEYS[4] wake            LIST
KEYS[5] seq             STRING counter
KEYS[6] events          STREAM

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] fields per job (= 12), then per job:
  id, payload, content type, max_attempts, result_ttl, min_backoff, max_backoff, max_stalls,
  priority, run_at (epoch ms; 0 = none), waiter (1 = register a waiter for the final outcome),
  delay (ms from now; the job is due at the later of run_at and now + delay)

Returns, per job, four items: code, state, result, error
  code 1 QUEUED    new job stored; state 'queued' or 'scheduled'
  code 2 DUPLICATE id exists and has not completed; state is its state, error its error if failed
  code 3 COMPLETED id exists and completed; result is the cached result
Events: 'queued' or 'scheduled' for each new job. Wakes one worker when any job is queued.
]]
--@include common

local job_prefix, queued_key, scheduled_key = KEYS[1], KEYS[2], KEYS[3]
local wake_key, seq_key, events_key = KEYS[4], KEYS[5], KEYS[6]
local now = now_ms(ARGV[1])
local maxlen = ARGV[2]
local width = tonumber(ARGV[3])
local out = {}
local woke = false
-- One INCRBY reserves a FIFO sequence number for every job of the call (ids that turn out to
-- be duplicates leave gaps, which order does not mind): one command instead of one per job.
local njobs = (#ARGV - 3) / width
local seq = redis.call('INCRBY', seq_key, njobs) - njobs

for base = 4, #ARGV, width do
  seq = seq + 1
  local id = ARGV[base]
  local job_key = job_prefix .. id
  local existing = redis.call('HMGET', job_key, 'state', 'result', 'error')
  local waiter = ARGV[base + 10] == '1'
  if existing[1] then
    local code = 2
    if existing[1] == 'completed' then code = 3 end
    if waiter and code == 2 and existing[1] ~= 'failed' and existing[1] ~= 'cancelled' then
      redis.call('HINCRBY', job_key, 'waiters', 1)
    end
    table.insert(out, code)
    table.insert(out, existing[1])
    table.insert(out, existing[2] or false)
    table.insert(out, existing[3] or false)
  else
    local run_at = math.max(tonumber(ARGV[base + 9]), now + tonumber(ARGV[base + 11]))
    local state = 'queued'
    if run_at > now then state = 'scheduled' end
    redis.call('HSET', job_key,
      'state', state, 'payload', ARGV[base + 1], 'ctype', ARGV[base + 2],
      'max_attempts', ARGV[base + 3], 'result_ttl', ARGV[base + 4],
      'min_backoff', ARGV[base + 5], 'max_backoff', ARGV[base + 6],
      'max_stalls', ARGV[base + 7], 'priority', ARGV[base + 8], 'seq', seq,
      'created', fmt(now))
    -- attempts, stalls, token and waiters start at 0 by being absent (HINCRBY and the
    -- readers treat a missing field as 0): four fewer fields to write per job.
    if waiter then redis.call('HSET', job_key, 'waiters', 1) end
    if state == 'scheduled' then
      redis.call('HSET', job_key, 'run_at', fmt(run_at))
      redis.call('ZADD', scheduled_key, run_at, id)
    else
      redis.call('ZADD', queued_key, queued_score(ARGV[base + 8], seq), id)
      woke = true
    end
    emit(events_key, maxlen, id, state, now)
    table.insert(out, 1)
    table.insert(out, state)
    table.insert(out, false)
    table.insert(out, false)
  end
end

if woke then wake(wake_key) end
return out
