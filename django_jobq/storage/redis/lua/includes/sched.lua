-- Helpers of the scheduling features (blocked successors, dedup keys, moved due times),
-- inlined by the loader where a script says `--@include sched` (after `--@include common`).
--
-- Redis runs a script's whole chunk on every call, so each top-level `local function` is a new
-- closure on every call. The hot scripts (complete_many, fail, reap...) need these helpers only
-- for the few jobs that use the features, so they are built on first use within a call:
-- `sched()` returns them, and a call that never asks pays for one closure.
local sched_helpers = nil
local function sched()
  if sched_helpers then return sched_helpers end
  local h = {}

  h.WAITING = { scheduled = true, queued = true, retrying = true }

  -- The keys a job's end touches besides its own. Scripts pass them in this order.
  function h.settle_keys(keys, first)
    return {
      job_prefix = keys[first], succ_prefix = keys[first + 1], dedup_prefix = keys[first + 2],
      blocked = keys[first + 3], queued = keys[first + 4], scheduled = keys[first + 5],
      wake = keys[first + 6], events = keys[first + 7],
    }
  end

  -- Store a job hash's order key in the sorted set of queued jobs.
  function h.index_queued(queued_key, job_key, id)
    local f = redis.call('HMGET', job_key, 'priority', 'seq', 'lifo')
    redis.call('ZADD', queued_key, queued_score(f[1], f[2], f[3]), id)
  end

  -- A dedup key's value is "<deadline ms>:<holder id>" (deadline 0: none). The deadline is
  -- checked against the script's clock, the same clock as every other due time (an injected
  -- test clock included); the key's own PX TTL (deadline + DEDUP_GRACE) only collects it.
  local DEDUP_GRACE = 60000
  function h.dedup_value(raw)
    if not raw then return nil, nil end
    local deadline, holder = string.match(raw, '^(%d+):(.*)$')
    return holder, tonumber(deadline)
  end

  function h.hold_dedup(dedup_key, id, ttl, now)
    if ttl > 0 then
      redis.call('SET', dedup_key, fmt(now + ttl) .. ':' .. id, 'PX', ttl + DEDUP_GRACE)
    else
      redis.call('SET', dedup_key, '0:' .. id)
    end
  end

  -- A simple-mode dedup key is held until its holder finishes: free it, unless it has already
  -- passed to another job (its TTL ran out and a newer job took it).
  function h.release_dedup(dedup_prefix, id, key, mode)
    if key and mode == 'simple' then
      local dedup_key = dedup_prefix .. key
      if h.dedup_value(redis.call('GET', dedup_key)) == id then
        redis.call('DEL', dedup_key)
      end
    end
  end

  -- Replace a finished record by its blocked singleton successor, under the same id: a fresh
  -- run (attempts and stalls 0, created now), queued or scheduled by the successor's due
  -- time, with the successor's own order key. Waiters of the finished run were told by
  -- finish(). The fencing token carries on, so a late verdict of the finished run can never
  -- pass for one of the successor's.
  function h.release_successor(s, maxlen, id, now)
    local job_key, succ_key = s.job_prefix .. id, s.succ_prefix .. id
    local raw = redis.call('HGETALL', succ_key)
    local token = redis.call('HGET', job_key, 'token') or '0'
    redis.call('DEL', job_key, succ_key)
    redis.call('SREM', s.blocked, id)
    if #raw == 0 then return end
    local fields, due = {}, 0
    for i = 1, #raw, 2 do
      if raw[i] == 'due' then
        due = tonumber(raw[i + 1])
      else
        fields[#fields + 1] = raw[i]
        fields[#fields + 1] = raw[i + 1]
      end
    end
    local state = 'queued'
    if due > now then state = 'scheduled' end
    redis.call('HSET', job_key, 'state', state, 'created', fmt(now), 'token', token,
      unpack(fields))
    if state == 'scheduled' then
      redis.call('HSET', job_key, 'run_at', fmt(due))
      redis.call('ZADD', s.scheduled, due, id)
    else
      h.index_queued(s.queued, job_key, id)
    end
    emit(s.events, maxlen, id, state, now)
    wake(s.wake)  -- queued: claimable; scheduled: idle workers re-read the next due time
  end

  -- Everything that follows a job's final state in the same step: its simple dedup key is
  -- freed and its blocked successor (when `succ` is '1') takes over the id.
  function h.settle(s, maxlen, id, succ, dedup_key, dedup_mode, now)
    h.release_dedup(s.dedup_prefix, id, dedup_key, dedup_mode)
    if succ == '1' then h.release_successor(s, maxlen, id, now) end
  end

  -- Give a waiting job (scheduled / queued / retrying) the due time `due`: at or before `now`
  -- it becomes queued (at its order key's place), later a queued job becomes scheduled and a
  -- scheduled or retrying one keeps its state with the new time. `k` holds the queued,
  -- scheduled, stats, wake and events keys and maxlen. Returns the state after.
  function h.move_due(k, job_key, id, state, due, now)
    if due <= now then
      if state ~= 'queued' then
        if state == 'retrying' then redis.call('HINCRBY', k.stats, 'retrying', -1) end
        redis.call('ZREM', k.scheduled, id)
        redis.call('HSET', job_key, 'state', 'queued')
        h.index_queued(k.queued, job_key, id)
        emit(k.events, k.maxlen, id, 'queued', now)
        wake(k.wake)
      end
      return 'queued'
    end
    local before = now
    if state == 'queued' then
      redis.call('ZREM', k.queued, id)
      state = 'scheduled'
    else
      before = tonumber(redis.call('HGET', job_key, 'run_at') or '0')
    end
    redis.call('HSET', job_key, 'state', state, 'run_at', fmt(due))
    redis.call('ZADD', k.scheduled, due, id)
    emit(k.events, k.maxlen, id, state, now)
    -- Idle workers sleep until the due time they were told; an earlier one must wake them.
    if due < before then wake(k.wake) end
    return state
  end

  sched_helpers = h
  return h
end
