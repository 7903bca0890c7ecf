--[[ enqueue: store one or more new jobs, deduplicated by id, in one atomic step.

The rules (storage/base.py, Storage.enqueue) are applied job by job, in order, so the jobs of
one call give the results of the same enqueues made one after another.

KEYS[1] job key prefix        "{p:q}:job:"
KEYS[2] queued                ZSET
KEYS[3] scheduled             ZSET
KEYS[4] wake                  LIST
KEYS[5] seq                   STRING counter
KEYS[6] events                STREAM
KEYS[7] successor key prefix  "{p:q}:succ:"
KEYS[8] dedup key prefix      "{p:q}:dedup:"
KEYS[9] blocked               SET of ids with a successor
KEYS[10] stats                HASH (the retrying count, when an update promotes one)
KEYS[11] generation           STRING (reconcile's re-creations only, ``enqueue_fenced``): the
  queue's obliteration counter; the last ARGV item is its value when the caller read the
  journal, and the call stores nothing and returns {-1} when it has moved since

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] K, the number of argument sets that follow (jobs of one call usually share one), each
  of ten items. An option set:
    content type, max_attempts, result_ttl, min_backoff, max_backoff, max_stalls, priority,
    run_at (epoch ms; 0 = none), waiter (1 = register a waiter for the final outcome),
    delay (ms from now; the job is due at the later of run_at and now + delay)
  or a scheduling set (only for jobs that use those options):
    lifo ('1' or ''), singleton ('1' or ''), update flags (letters: d data, m max_attempts,
    b backoff, c reset counts), update run_at mode ('', 'yes', 'if_later', 'if_earlier'),
    group (''), dedup key (''), dedup mode, dedup ttl (ms; 0 = none), two unused items
then per job three items: id, payload, set ("n": option set n; "n:m": option set n and
scheduling set m; 1-based)

Returns, per job: code, state, result, error, and for codes 12 and 14 a fifth item: the id
of the job holding the dedup key, which the answer is about.
  code 1 QUEUED    new job stored; state 'queued' or 'scheduled', or 'blocked' (a singleton
                   successor stored behind the active job with this id)
  code 2 DUPLICATE id exists and has not completed (and an update had nothing to change: every
                   field it names already holds the new value); state is its state, error its
                   error if failed
  code 3 COMPLETED id exists and completed; result is the cached result
  code 4 UPDATED   a waiting job with this id (or its blocked successor) was updated; state after
  code 12, 14      DUPLICATE, UPDATED answered by the dedup key's holder (result and error its
                   own)
Events: 'queued' or 'scheduled' for each new job, 'blocked' for a successor, the new state for
an update that moves a due time. Wakes one worker when any job is queued.
]]
--@include common
--@include sched

local job_prefix, queued_key, scheduled_key = KEYS[1], KEYS[2], KEYS[3]
local wake_key, seq_key, events_key = KEYS[4], KEYS[5], KEYS[6]
local succ_prefix, dedup_prefix, blocked_key = KEYS[7], KEYS[8], KEYS[9]
local last_arg = #ARGV
if KEYS[11] then
  if (redis.call('GET', KEYS[11]) or '0') ~= ARGV[last_arg] then return {-1} end
  last_arg = last_arg - 1
end
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
local njobs = (last_arg - first_job + 1) / 3
local seq = redis.call('INCRBY', seq_key, njobs) - njobs

-- Send the gathered ZADDs. Also called before an update re-indexes a job (move_due), so that
-- a job stored earlier in this call is in its set before it is moved.
local function flush()
  if #queued_args > 0 then redis.call('ZADD', queued_key, unpack(queued_args)) end
  if #scheduled_args > 0 then
    local earliest = scheduled_args[1]
    for i = 3, #scheduled_args, 2 do earliest = math.min(earliest, scheduled_args[i]) end
    wake_if_earliest(scheduled_key, wake_key, earliest)
    redis.call('ZADD', scheduled_key, unpack(scheduled_args))
  end
  queued_args, scheduled_args = {}, {}
end

local function answer(code, state, result, err)
  out[#out + 1] = code
  out[#out + 1] = state
  out[#out + 1] = result or false
  out[#out + 1] = err or false
end

-- The rules for jobs with a scheduling set, built on the first such job of the call (see
-- sched.lua: plain calls do not pay for closures they never run).
local scheduling_rules = nil
local function scheduling()
  if scheduling_rules then return scheduling_rules end
  local r = {}
  local h = sched()
  local k = { queued = queued_key, scheduled = scheduled_key, stats = KEYS[10],
    wake = wake_key, events = events_key, maxlen = maxlen }
  local UPDATABLE = { 'payload', 'ctype', 'max_attempts', 'min_backoff', 'max_backoff',
    'attempts', 'stalls' }
  r.WAITING = h.WAITING

  -- The job's due time: the later of run_at and now + delay, and now + ttl in debounce mode.
  function r.due_of(o, x)
    local due = math.max(tonumber(ARGV[o + 7]), now + tonumber(ARGV[o + 9]))
    if ARGV[x + 6] == 'debounce' then due = math.max(due, now + tonumber(ARGV[x + 7])) end
    return due
  end

  -- Whether update_run_at mode `mode` changes a due time `current` to `due`. A job due at or
  -- before now is due "now": nothing is earlier, and only a future time is later or
  -- different.
  local function run_at_applies(mode, current, due)
    if current <= now then return (mode == 'yes' or mode == 'if_later') and due > now end
    return (mode == 'yes' and due ~= current) or (mode == 'if_later' and due > current)
      or (mode == 'if_earlier' and due < current)
  end

  -- The fields JobUpdate flags `flags` change in a hash whose current values are `cur`
  -- (UPDATABLE, in order), as HSET arguments. A field that already holds the new value is no
  -- change.
  local function changed_fields(flags, cur, o, payload)
    local fields = {}
    local function put(name, old, new)
      if old ~= new then
        fields[#fields + 1] = name
        fields[#fields + 1] = new
      end
    end
    if string.find(flags, 'd', 1, true) then
      put('payload', cur[1], payload)
      put('ctype', cur[2], ARGV[o])
    end
    if string.find(flags, 'm', 1, true) then put('max_attempts', cur[3], ARGV[o + 1]) end
    if string.find(flags, 'b', 1, true) then
      put('min_backoff', cur[4], ARGV[o + 3])
      put('max_backoff', cur[5], ARGV[o + 4])
    end
    if string.find(flags, 'c', 1, true) then
      put('attempts', cur[6] or '0', '0')
      put('stalls', cur[7] or '0', '0')
    end
    return fields
  end

  -- Rule 2: update a waiting record in place. Returns its state after, or nil when the
  -- update has nothing to change (then nothing is written).
  function r.update_record(job_key, id, state, o, x, payload)
    local mode = ARGV[x + 3]
    local cur = redis.call('HMGET', job_key, 'run_at', unpack(UPDATABLE))
    local current = now
    if state ~= 'queued' then current = tonumber(cur[1]) end
    table.remove(cur, 1)
    local fields = changed_fields(ARGV[x + 2], cur, o, payload)
    local due = r.due_of(o, x)
    local move = mode ~= '' and run_at_applies(mode, current, due)
    if #fields == 0 and not move then return nil end
    flush()
    if #fields > 0 then redis.call('HSET', job_key, unpack(fields)) end
    if move then state = h.move_due(k, job_key, id, state, due, now) end
    return state
  end

  -- Rule 3: the id is active and this is a singleton enqueue. Returns the code: 1 successor
  -- stored, 4 successor updated, 2 nothing to change.
  function r.singleton(job_key, id, o, x, payload, seq_no)
    local succ_key = succ_prefix .. id
    if redis.call('HGET', job_key, 'succ') ~= '1' then
      local fields = {
        'payload', payload, 'ctype', ARGV[o], 'max_attempts', ARGV[o + 1],
        'result_ttl', ARGV[o + 2], 'min_backoff', ARGV[o + 3], 'max_backoff', ARGV[o + 4],
        'max_stalls', ARGV[o + 5], 'priority', ARGV[o + 6], 'seq', seq_no,
        'due', fmt(r.due_of(o, x)),
      }
      if ARGV[x] == '1' then
        fields[#fields + 1] = 'lifo'
        fields[#fields + 1] = '1'
      end
      if ARGV[x + 4] ~= '' then
        fields[#fields + 1] = 'group'
        fields[#fields + 1] = ARGV[x + 4]
      end
      redis.call('HSET', succ_key, unpack(fields))
      redis.call('HSET', job_key, 'succ', '1')
      redis.call('SADD', blocked_key, id)
      emit(events_key, maxlen, id, 'blocked', now)
      return 1
    end
    local mode = ARGV[x + 3]
    local cur = redis.call('HMGET', succ_key, 'due', unpack(UPDATABLE))
    local current = tonumber(cur[1])
    table.remove(cur, 1)
    local fields = changed_fields(ARGV[x + 2], cur, o, payload)
    local due = r.due_of(o, x)
    if mode ~= '' and run_at_applies(mode, current, due) then
      fields[#fields + 1] = 'due'
      fields[#fields + 1] = fmt(due)
    end
    if #fields == 0 then return 2 end
    redis.call('HSET', succ_key, unpack(fields))
    return 4
  end

  -- The dedup key of a new id: returns true when its holder answered this enqueue (the
  -- answer is written), false when the key is free (the caller stores the job, which takes
  -- it).
  function r.held_by_dedup(o, x, payload, waiter)
    local dedup_key = dedup_prefix .. ARGV[x + 5]
    local holder, deadline = h.dedup_value(redis.call('GET', dedup_key))
    if not holder or (deadline > 0 and deadline <= now) then return false end
    local holder_key = job_prefix .. holder
    local f = redis.call('HMGET', holder_key, 'state', 'result', 'error', 'dmode')
    local state = f[1]
    if not state then return false end  -- the holder's record is gone: the key is free
    -- The key keeps the rules of the mode it was taken in (a throttle key stays held for its
    -- TTL whatever the holder does, even when this enqueue names another mode), as on every
    -- backend.
    local mode = f[4] or ARGV[x + 6]
    local final = state == 'completed' or state == 'failed' or state == 'cancelled'
    local code = 12
    if mode == 'simple' then
      if final then return false end
    elseif mode == 'debounce' then
      if not h.WAITING[state] then return false end
      flush()
      redis.call('HSET', holder_key, 'payload', payload, 'ctype', ARGV[o])
      state = h.move_due(k, holder_key, holder, state, r.due_of(o, x), now)
      h.hold_dedup(dedup_key, holder, tonumber(ARGV[x + 7]), now)
      code = 14
    end
    if waiter and not final then redis.call('HINCRBY', holder_key, 'waiters', 1) end
    answer(code, state, f[2], f[3])
    out[#out + 1] = holder
    return true
  end

  -- The scheduling fields of a new job (and the dedup key it takes). Returns its lifo flag.
  function r.store(job_key, id, x)
    local lifo = nil
    if ARGV[x] == '1' then
      lifo = '1'
      redis.call('HSET', job_key, 'lifo', '1')
    end
    if ARGV[x + 4] ~= '' then redis.call('HSET', job_key, 'group', ARGV[x + 4]) end
    local dedup = ARGV[x + 5]
    if dedup ~= '' then
      redis.call('HSET', job_key, 'dedup', dedup, 'dmode', ARGV[x + 6])
      h.hold_dedup(dedup_prefix .. dedup, id, tonumber(ARGV[x + 7]), now)
    end
    return lifo
  end

  scheduling_rules = r
  return r
end

for base = first_job, last_arg, 3 do
  seq = seq + 1
  local id = ARGV[base]
  local set = ARGV[base + 2]
  local o, x = tonumber(set), nil
  if o then
    o = 4 + (o - 1) * SET_WIDTH  -- this job's option set
  else
    local a, b = string.match(set, '^(%d+):(%d+)$')
    o = 4 + (tonumber(a) - 1) * SET_WIDTH
    x = 4 + (tonumber(b) - 1) * SET_WIDTH  -- and its scheduling set
  end
  local job_key = job_prefix .. id
  local existing = redis.call('HMGET', job_key, 'state', 'result', 'error')
  local waiter = ARGV[o + 8] == '1'
  local state = existing[1]
  if state then
    local code = 2
    if state == 'completed' then
      code = 3
    elseif x and (ARGV[x + 2] ~= '' or ARGV[x + 3] ~= '') and scheduling().WAITING[state] then
      local after = scheduling().update_record(job_key, id, state, o, x, ARGV[base + 1])
      if after then
        state = after
        code = 4
      end
    elseif x and state == 'active' and ARGV[x + 1] == '1' then
      code = scheduling().singleton(job_key, id, o, x, ARGV[base + 1], seq)
      state = 'blocked'
    end
    -- A waiter joins the record (never a blocked successor: the Queue API refuses singleton
    -- with enqueue_and_wait) unless the record has already reached its outcome.
    if waiter and code ~= 3 and state ~= 'blocked' and state ~= 'failed'
        and state ~= 'cancelled' then
      redis.call('HINCRBY', job_key, 'waiters', 1)
    end
    answer(code, state, existing[2], existing[3])
  elseif not (x and ARGV[x + 5] ~= ''
              and scheduling().held_by_dedup(o, x, ARGV[base + 1], waiter)) then
    local run_at
    if x then
      run_at = scheduling().due_of(o, x)
    else
      run_at = math.max(tonumber(ARGV[o + 7]), now + tonumber(ARGV[o + 9]))
    end
    state = 'queued'
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
    local lifo = nil
    if x then lifo = scheduling().store(job_key, id, x) end
    if state == 'scheduled' then
      redis.call('HSET', job_key, 'run_at', fmt(run_at))
      scheduled_args[#scheduled_args + 1] = run_at
      scheduled_args[#scheduled_args + 1] = id
    else
      queued_args[#queued_args + 1] = queued_score(ARGV[o + 6], seq, lifo)
      queued_args[#queued_args + 1] = id
      woke = true
    end
    emit(events_key, maxlen, id, state, now)
    answer(1, state)
  end
end
-- A job enqueued twice within one call: the second sees the first's hash (HMGET above), so an
-- id appears at most once in these lists.
flush()

if woke then wake(wake_key) end
return out
