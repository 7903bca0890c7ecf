-- Shared helpers, inlined by the loader where a script says `--@include common`.
-- Integers are written with %d so hash fields never hold "1.7e+12" forms.

local function fmt(n) return string.format('%d', n) end

-- Epoch milliseconds: the caller's injected clock when ARGV gave one (> 0), else the server's
-- TIME, so that leases never depend on a worker's clock.
local function now_ms(arg)
  local n = tonumber(arg)
  if n and n > 0 then return n end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Fencing tokens. A token must never repeat for a job id, even when Redis lost the record and
-- the id was created again (journal reconcile, re-enqueue after expiry): a counter kept in the
-- record would restart at 1 and hand a stale worker the token of the new run. So the base of a
-- claim's token comes from outside the record: the server's TIME in microseconds, times 1000,
-- plus a nonce 0-999 drawn by the claimer. A claim takes max(previous + 1, base), so tokens of
-- one record still only grow, whatever the clock does. A new record collides with an old
-- token only if the server clock stepped back to that very microsecond and the nonce matched
-- too. Tokens are 19-digit integers, past a double's 2^53: they are kept as decimal strings in
-- Lua and incremented by HINCRBY (exact 64-bit arithmetic in Redis), never with Lua numbers.
-- TIME is read even with an injected clock: the clock moves leases, not token uniqueness.
local function token_base(nonce)
  local t = redis.call('TIME')
  return t[1] .. string.format('%06d%03d', tonumber(t[2]), tonumber(nonce) % 1000)
end

-- The claim's token, given the record's current one (`prev`, read by the caller's HMGET). The
-- caller writes it with its own HSET; only when `prev` is not below the base (a claim within
-- the same microsecond, or a clock that stepped back) does this write, by HINCRBY.
local function next_token(job_key, base, prev)
  if prev and (#prev > #base or (#prev == #base and prev >= base)) then
    redis.call('HINCRBY', job_key, 'token', 1)
    return redis.call('HGET', job_key, 'token')
  end
  return base
end

-- Ordering score of a queued job: priority first (lower first); within a priority every LIFO
-- job (newest first) before every FIFO job (oldest first). The order key (priority, seq, lifo)
-- lives in the job hash, so a job that comes back to queued gets the same score.
-- |priority| <= 1000 (checked at the edge) and seq < 2^42 keep every score an exact integer
-- in a double: 1001 * 2^43 < 2^53.
local PRIORITY_SHIFT = 8796093022208  -- 2^43
local LIFO_SPLIT = 4398046511104  -- 2^42
local function queued_score(priority, seq, lifo)
  if lifo == '1' then
    return tonumber(priority) * PRIORITY_SHIFT + LIFO_SPLIT - tonumber(seq)
  end
  return tonumber(priority) * PRIORITY_SHIFT + LIFO_SPLIT + tonumber(seq)
end

-- The value an event carries (Event.data: a result, an error, a progress value), up to this
-- many bytes (states.EVENT_DATA_MAX, held equal by a test); a larger one is left out and the
-- entry says so ('omitted'), so a stream of 100,000 entries stays a few MB. ct: the result's
-- serde when not JSON.
local EVENT_DATA_MAX = 1024

local function emit(events_key, maxlen, job_id, kind, now, worker, data, ct)
  if data then
    local fields = {'job', job_id, 'kind', kind, 'at', fmt(now)}
    if worker then fields[#fields + 1] = 'worker'; fields[#fields + 1] = worker end
    if #data <= EVENT_DATA_MAX then
      fields[#fields + 1] = 'data'; fields[#fields + 1] = data
      if ct and ct ~= 'json' then fields[#fields + 1] = 'ct'; fields[#fields + 1] = ct end
    else
      fields[#fields + 1] = 'omitted'; fields[#fields + 1] = '1'
    end
    redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*', unpack(fields))
  elseif worker then
    redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*',
      'job', job_id, 'kind', kind, 'at', fmt(now), 'worker', worker)
  else
    redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*',
      'job', job_id, 'kind', kind, 'at', fmt(now))
  end
end

-- Wake one idle worker. The list holds at most one marker: a claimer that leaves work behind
-- pushes it again, so a burst wakes workers one after another without piling markers up.
-- Every push to the list goes through here, so "push only when empty" keeps it at one marker;
-- while a marker waits (no worker idle, e.g. a busy pool or a burst of enqueues) that is one
-- LLEN instead of a push and a trim.
local function wake(wake_key)
  if redis.call('LLEN', wake_key) == 0 then redis.call('LPUSH', wake_key, '1') end
end

-- Call before adding a scheduled job due at run_at. An idle worker blocks until the earliest
-- due time it saw at its last claim (or its idle timeout): a job due before every scheduled
-- one must end that wait, or it runs up to an idle timeout late. Later ones need no wake-up.
local function wake_if_earliest(scheduled_key, wake_key, run_at)
  local head = redis.call('ZRANGE', scheduled_key, 0, 0, 'WITHSCORES')
  if head[2] == nil or run_at < tonumber(head[2]) then wake(wake_key) end
end

-- Close a job in a final state: stamp it, make the record expire after its result TTL (its id
-- stays deduplicated until then), count it, and hand the outcome to every registered waiter.
-- For a caller whose HMGET already read the record's result_ttl and waiters (`ttl`, `waiters`,
-- as read: strings or false), with more fields to write in the same HSET (`...`: field, value
-- pairs); finish() below reads them itself. One HSET for every field: a verdict on the
-- request/response path makes fewer calls (every keyed call costs server time, and the waiting
-- caller wakes only after the script ends).
local function finish_read(job_key, done_key, stats_key, state, body, now, ttl, waiters, ...)
  waiters = tonumber(waiters or '0')
  if waiters > 0 then
    redis.call('HSET', job_key, 'state', state, 'finished', fmt(now), 'waiters', 0, ...)
  else
    redis.call('HSET', job_key, 'state', state, 'finished', fmt(now), ...)
  end
  ttl = tonumber(ttl)
  redis.call('PEXPIRE', job_key, ttl)
  redis.call('HINCRBY', stats_key, state, 1)
  if waiters > 0 then
    local message = state .. '\n' .. (body or '')
    for _ = 1, waiters do redis.call('RPUSH', done_key, message) end
    -- A waiter that is there pops at once; this only bounds what a timed-out waiter leaves.
    redis.call('PEXPIRE', done_key, math.min(ttl, 60000))
  end
end

local function finish(job_key, done_key, stats_key, state, body, now)
  local f = redis.call('HMGET', job_key, 'result_ttl', 'waiters')
  finish_read(job_key, done_key, stats_key, state, body, now, f[1], f[2])
end

-- A job that failed for good joins the dead-letter list, scored by when its record expires
-- (finish() set that TTL: the result TTL after now), unless a blocked singleton successor took
-- the id over. The list reads newest first, so two jobs failed within one millisecond must not
-- tie: on the server's own clock the score carries the microseconds (as a decimal string, since
-- Lua would print the number with 14 digits and drop them). PTTL read back is no substitute: it
-- can come out a millisecond short and swap two neighbours.
local function bury(job_key, dead_key, id, now)
  local f = redis.call('HMGET', job_key, 'state', 'result_ttl')
  if f[1] ~= 'failed' then return end
  local t = redis.call('TIME')
  local at = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
  -- The server's microseconds only when its clock is the script's (its now read moments ago,
  -- in this millisecond or the next); a caller's clock (tests inject one) keeps its own time,
  -- or the list's scores would mix two clocks and prune by the wrong one.
  if at < now or at >= now + 2 then at = now end
  local score = at + math.max(tonumber(f[2]) or 0, 0)
  redis.call('ZADD', dead_key, string.format('%.3f', score), id)
end

-- A job that failed for good gets a failure-handler call when the queue's hook is on: a copy
-- of what the handler needs (payload, content type, error, attempts, failed-at), so the call
-- outlives the record's TTL and a successor taking the id. Runs before settle(), which may
-- put a successor under the id. The member's counter keeps two failures of one id apart.
local function record_failure(job_key, config_key, onfail_key, call_prefix, id, now)
  if redis.call('HGET', config_key, 'onfail') ~= '1' then return end
  local f = redis.call('HMGET', job_key, 'payload', 'ctype', 'error', 'attempts')
  local member = id .. ':' .. redis.call('HINCRBY', config_key, 'onfail_seq', 1)
  redis.call('HSET', call_prefix .. member, 'id', id, 'payload', f[1] or '',
    'ctype', f[2] or 'json', 'error', f[3] or '', 'attempts', f[4] or '0',
    'failed', fmt(now), 'tries', 0)
  redis.call('ZADD', onfail_key, now, member)
end

-- Move due scheduled / retrying jobs to queued (at most `limit`). Returns how many moved.
local function promote_due(job_prefix, scheduled_key, queued_key, stats_key, events_key,
                           maxlen, now, limit)
  local due = redis.call('ZRANGEBYSCORE', scheduled_key, '-inf', fmt(now), 'LIMIT', 0, limit)
  for _, id in ipairs(due) do
    local job_key = job_prefix .. id
    local f = redis.call('HMGET', job_key, 'state', 'priority', 'seq', 'lifo')
    if f[1] == 'retrying' then redis.call('HINCRBY', stats_key, 'retrying', -1) end
    if f[1] then
      redis.call('HSET', job_key, 'state', 'queued')
      redis.call('ZADD', queued_key, queued_score(f[2], f[3], f[4]), id)
      emit(events_key, maxlen, id, 'queued', now)
    end
    redis.call('ZREM', scheduled_key, id)
  end
  return #due
end
