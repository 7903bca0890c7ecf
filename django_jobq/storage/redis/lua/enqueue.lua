--[[ enqueue: store one or more new jobs, deduplicated by id, in one atomic step.

KEYS[1] job key prefix  "{p:q}:job:"
KEYS[2] queued          ZSET
KEYS[3] scheduled       ZSET
KEYS[4] wake            LIST
KEYS[5] seq             STRING counter
KEYS[6] events          STREAM

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] K, the number of option sets that follow (jobs of one call usually share one), each:
  content type, max_attempts, result_ttl, min_backoff, max_backoff, max_stalls, priority,
  run_at (epoch ms; 0 = none), waiter (1 = register a waiter for the final outcome),
  delay (ms from now; the job is due at the later of run_at and now + delay)
then per job three items: id, payload, option set number (1..K)

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
local SET_WIDTH = 10
local nsets = tonumber(ARGV[3])
local first_job = 4 + nsets * SET_WIDTH
local out = {}
local woke = false
-- ZADD arguments gathered for one call per sorted set at the end (fewer Lua -> Redis calls).
local queued_args, scheduled_args = {}, {}
-- One INCRBY reserves a FIFO sequence number for every job of the call (ids that turn out to
-- be duplicates leave gaps, which order does not mind): one command instead of one per job.
local njobs = (#ARGV - first_job + 1) / 3
local seq = redis.call('INCRBY', seq_key, njobs) - njobs

for base = first_job, #ARGV, 3 do
  seq = seq + 1
  local id = ARGV[base]
  local o = 4 + (tonumber(ARGV[base + 2]) - 1) * SET_WIDTH  -- this job's option set
  local job_key = job_prefix .. id
  local existing = redis.call('HMGET', job_key, 'state', 'result', 'error')
  local waiter = ARGV[o + 8] == '1'
  if existing[1] then
    local code = 2
    if existing[1] == 'completed' then code = 3 end
    if waiter and code == 2 and existing[1] ~= 'failed' and existing[1] ~= 'cancelled' then
      redis.call('HINCRBY', job_key, 'waiters', 1)
    end
    out[#out + 1] = code
    out[#out + 1] = existing[1]
    out[#out + 1] = existing[2] or false
    out[#out + 1] = existing[3] or false
  else
    local run_at = math.max(tonumber(ARGV[o + 7]), now + tonumber(ARGV[o + 9]))
    local state = 'queued'
    if run_at > now then state = 'scheduled' end
    redis.call('HSET', job_key,
      'state', state, 'payload', ARGV[base + 1], 'ctype', ARGV[o],
      'max_attempts', ARGV[o + 1], 'result_ttl', ARGV[o + 2],
      'min_backoff', ARGV[o + 3], 'max_backoff', ARGV[o + 4],
      'max_stalls', ARGV[o + 5], 'priority', ARGV[o + 6], 'seq', seq,
      'created', fmt(now))
    -- attempts, stalls, token and waiters start at 0 by being absent (HINCRBY and the
    -- readers treat a missing field as 0): four fewer fields to write per job.
    if waiter then redis.call('HSET', job_key, 'waiters', 1) end
    if state == 'scheduled' then
      redis.call('HSET', job_key, 'run_at', fmt(run_at))
      scheduled_args[#scheduled_args + 1] = run_at
      scheduled_args[#scheduled_args + 1] = id
    else
      queued_args[#queued_args + 1] = queued_score(ARGV[o + 6], seq)
      queued_args[#queued_args + 1] = id
      woke = true
    end
    emit(events_key, maxlen, id, state, now)
    out[#out + 1] = 1
    out[#out + 1] = state
    out[#out + 1] = false
    out[#out + 1] = false
  end
end
-- A job enqueued twice within one call: the second sees the first's hash (HMGET above), so an
-- id appears at most once in these lists.
if #queued_args > 0 then redis.call('ZADD', queued_key, unpack(queued_args)) end
if #scheduled_args > 0 then redis.call('ZADD', scheduled_key, unpack(scheduled_args)) end

if woke then wake(wake_key) end
return out
