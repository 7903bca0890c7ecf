--[[ claim: lease up to N runnable jobs to one worker, in one atomic step.

There is no instant at which a popped job is not also recorded as active with a lease: the pop
and the lease happen inside this script, so a worker crash after it leaves a job the reaper sees.
Flow control is decided here too, on the state of this instant, so no number of workers can
together pass a limit.

KEYS[1]  job key prefix "{p:q}:job:"
KEYS[2]  queued            ZSET id -> order score
KEYS[3]  scheduled         ZSET id -> due ms
KEYS[4]  active            ZSET id -> lease deadline
KEYS[5]  wake              LIST
KEYS[6]  events            STREAM
KEYS[7]  stats             HASH
KEYS[8]  config            HASH paused, until, concurrency, rate_max, rate_window,
                           group_rate_max, group_rate_window
KEYS[9]  rate              ZSET claim log of the queue (member "now:id:token" -> claim ms)
KEYS[10] group rate prefix "{p:q}:grate:" (group keys are validated like job ids)
KEYS[11] capped            STRING flag: set when the concurrency cap left jobs behind
KEYS[12] (optional) the claimer's own wake list, when this claim runs right behind its BLPOP
         (wait_and_claim): a marker still there means interrupt_wait (shutdown) woke it

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] worker id
ARGV[4] count (max jobs to claim)
ARGV[5] lease (ms)
ARGV[6] promote limit (due scheduled jobs moved to queued first)
ARGV[7] scan limit: with group limits, candidates looked at beyond `count` per call
ARGV[8] token nonce 0-999, drawn by the claimer (see token_base in common.lua)

Returns: { ms until the claimer should look again (0 if overdue, -1: no time, wait for a
           wake-up), then per job: id, token (decimal string), attempt, max_attempts,
           min_backoff, max_backoff, ctype, payload, waited (ms from the job's enqueue, or
           its due time when later, to this claim) }
  Paused: nothing, -1 (resume wakes workers). Postponed queue-wide until T: nothing, T - now.
  Concurrency cap reached: nothing, -1 (the verdict that frees a slot wakes a worker). Rate
  budget spent: nothing, ms until the oldest claim leaves the window. Otherwise: ms until the
  earliest scheduled job is due.
Events: 'queued' per promoted job, 'active' per claimed job, 'scheduled' per candidate whose
group spent its budget (due when the group's oldest claim leaves the window; its order key
stays in its hash, so it comes back to the same place).
Re-pushes the wake marker when queued jobs remain and the limits allow more claims, so the
next idle worker wakes too.
]]
--@include common

local job_prefix, queued_key, scheduled_key = KEYS[1], KEYS[2], KEYS[3]
local active_key, wake_key, events_key, stats_key = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local config_key, rate_key, group_prefix, capped_key = KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local now = now_ms(ARGV[1])
local maxlen, worker = ARGV[2], ARGV[3]
local count, lease = tonumber(ARGV[4]), tonumber(ARGV[5])

-- A worker being stopped claims nothing (its BLPOP took one of the two stop markers).
if KEYS[12] and redis.call('LLEN', KEYS[12]) > 0 then return { -1 } end

local cfg = redis.call('HMGET', config_key, 'paused', 'until', 'concurrency', 'rate_max',
  'rate_window', 'group_rate_max', 'group_rate_window')
if cfg[1] then return { -1 } end
local until_ms = tonumber(cfg[2])
if until_ms and until_ms > now then return { until_ms - now } end

promote_due(job_prefix, scheduled_key, queued_key, stats_key, events_key, maxlen, now,
  tonumber(ARGV[6]))

local budget = count
local concurrency_left, rate_left = nil, nil
local concurrency = tonumber(cfg[3])
local rate_max, rate_window = tonumber(cfg[4]), tonumber(cfg[5])
local group_max, group_window = tonumber(cfg[6]), tonumber(cfg[7])
if concurrency or rate_max then
  if redis.call('ZCARD', queued_key) == 0 then budget = 0 end
end
if concurrency and budget > 0 then
  concurrency_left = concurrency - redis.call('ZCARD', active_key)
  if concurrency_left <= 0 then
    redis.call('SET', capped_key, '1')
    return { -1 }
  end
  budget = math.min(budget, concurrency_left)
end
if rate_max and rate_window and budget > 0 then
  redis.call('ZREMRANGEBYSCORE', rate_key, '-inf', fmt(now - rate_window))
  rate_left = rate_max - redis.call('ZCARD', rate_key)
  if rate_left <= 0 then
    local oldest = redis.call('ZRANGE', rate_key, 0, 0, 'WITHSCORES')
    return { math.max(tonumber(oldest[2]) + rate_window - now, 1) }
  end
  budget = math.min(budget, rate_left)
end

local out = { -1 }
local claimed = 0
local deadline = fmt(now + lease)
local base = token_base(ARGV[8])

-- `attempts`: the record's count as the caller's HMGET read it; the new one is written in
-- the same HSET as the rest (one call less per job than an HINCRBY beside it).
local function lease_job(id, job_key, f, prev_token, created, run_at, attempts)
  local ready = math.max(tonumber(created) or now, tonumber(run_at) or 0)
  local token = next_token(job_key, base, prev_token)
  local attempt = (tonumber(attempts) or 0) + 1
  redis.call('HSET', job_key, 'state', 'active', 'worker', worker, 'started', fmt(now),
    'token', token, 'attempts', attempt)
  redis.call('ZADD', active_key, deadline, id)
  emit(events_key, maxlen, id, 'active', now, worker)
  local n = #out
  out[n + 1] = id
  out[n + 2] = token
  out[n + 3] = attempt
  out[n + 4] = tonumber(f[4])
  out[n + 5] = tonumber(f[5])
  out[n + 6] = tonumber(f[6])
  out[n + 7] = f[3]
  out[n + 8] = f[2]
  out[n + 9] = math.max(now - ready, 0)
  claimed = claimed + 1
  if rate_left then
    redis.call('ZADD', rate_key, now, fmt(now) .. ':' .. id .. ':' .. token)
  end
  return token
end

if budget > 0 and not (group_max and group_window) then
  local popped = redis.call('ZPOPMIN', queued_key, budget)
  for i = 1, #popped, 2 do
    local id = popped[i]
    local job_key = job_prefix .. id
    local f = redis.call('HMGET', job_key, 'state', 'payload', 'ctype', 'max_attempts',
      'min_backoff', 'max_backoff', 'token', 'created', 'run_at', 'attempts')
    if f[1] == 'queued' then lease_job(id, job_key, f, f[7], f[8], f[9], f[10]) end
  end
elseif budget > 0 then
  -- Group limits: walk the best candidates (a bounded number), skipping those whose group
  -- has spent its budget. Each group's log is trimmed once per call and then counted here.
  local used, free_at = {}, {}
  local candidates = redis.call('ZRANGE', queued_key, 0, budget + tonumber(ARGV[7]) - 1)
  for _, id in ipairs(candidates) do
    if claimed >= budget then break end
    local job_key = job_prefix .. id
    local f = redis.call('HMGET', job_key, 'state', 'payload', 'ctype', 'max_attempts',
      'min_backoff', 'max_backoff', 'group', 'token', 'created', 'run_at', 'attempts')
    redis.call('ZREM', queued_key, id)
    if f[1] == 'queued' then
      local group = f[7]
      if not group then
        lease_job(id, job_key, f, f[8], f[9], f[10], f[11])
      else
        local log_key = group_prefix .. group
        if used[group] == nil then
          redis.call('ZREMRANGEBYSCORE', log_key, '-inf', fmt(now - group_window))
          used[group] = redis.call('ZCARD', log_key)
        end
        if used[group] < group_max then
          local token = lease_job(id, job_key, f, f[8], f[9], f[10], f[11])
          redis.call('ZADD', log_key, now, fmt(now) .. ':' .. id .. ':' .. token)
          redis.call('PEXPIRE', log_key, group_window)
          used[group] = used[group] + 1
        else
          if free_at[group] == nil then
            local oldest = redis.call('ZRANGE', log_key, 0, 0, 'WITHSCORES')
            free_at[group] = math.max(tonumber(oldest[2]) + group_window, now + 1)
          end
          redis.call('HSET', job_key, 'state', 'scheduled', 'run_at', fmt(free_at[group]))
          redis.call('ZADD', scheduled_key, free_at[group], id)
          emit(events_key, maxlen, id, 'scheduled', now)
        end
      end
    end
  end
end
if rate_left and claimed > 0 then redis.call('PEXPIRE', rate_key, rate_window) end

if redis.call('ZCARD', queued_key) > 0 then
  if concurrency_left and claimed >= concurrency_left then
    redis.call('SET', capped_key, '1')  -- the next verdict frees a slot and wakes a worker
  elseif not (rate_left and claimed >= rate_left) then
    wake(wake_key)  -- (a spent rate budget: the claimer's next call returns the wait)
  end
end
local first = redis.call('ZRANGE', scheduled_key, 0, 0, 'WITHSCORES')
if first[2] then out[1] = math.max(tonumber(first[2]) - now, 0) end
return out
