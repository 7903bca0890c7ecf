-- Retention of finished records per queue and final state (docs/settings.md, "retention"),
-- inlined where a script says `--@include retain` (after `--@include common`).
--
-- The policy lives in the queue's config hash, one field per final state:
-- 'keep:<state>' = "<count>:<age ms>" (0: no bound of that kind; absent or '': no retention,
-- so the record only expires by its result_ttl and is indexed nowhere, as before). A state
-- with a policy indexes its records in the ZSET '<finished prefix><state>' (id -> finish ms).
--
-- The steps that finish a job add it there and then remove at most RETAIN_STEP of the
-- oldest records past the policy, so an ack never does O(n) work: one add lets at most one
-- record fall out of the count, so the step keeps up, and a backlog (a policy made
-- stricter) shrinks by a few per finish while the reaper (retain.lua) takes it in batches.
-- An entry is only ever acted on after checking that its record is still the one it
-- indexed (same final state, same finish time): an id freed and enqueued anew, a record
-- retried by an operator or replaced by its singleton successor is never deleted by an old
-- entry. Such stale entries, and entries whose record expired by TTL, leave the index when
-- they reach its head (the reaper prunes them there) and meanwhile count toward the count.
-- Every removal emits a 'removed' event, so the model mirror deletes the job's row.
local RETAIN_STEP = 3

local function retention(config_key, index_prefix, job_prefix, dead_key, events_key, maxlen)
  local p = redis.call('HMGET', config_key, 'keep:completed', 'keep:failed', 'keep:cancelled')
  if not p[1] and not p[2] and not p[3] then return nil end
  local policy = {}
  for i, state in ipairs({ 'completed', 'failed', 'cancelled' }) do
    if p[i] and p[i] ~= '' then
      local count, age = string.match(p[i], '^(%d+):(%d+)$')
      policy[state] = { count = tonumber(count), age = tonumber(age) }
    end
  end
  return { policy = policy, index_prefix = index_prefix, job_prefix = job_prefix,
    dead = dead_key, events = events_key, maxlen = maxlen }
end

-- Delete the record an entry (already out of the index) stood for, if it still is that
-- finished record. Returns 1 when deleted.
local function remove_finished(r, state, id, score, now)
  local job_key = r.job_prefix .. id
  local f = redis.call('HMGET', job_key, 'state', 'finished')
  if f[1] ~= state or tonumber(f[2]) ~= score then return 0 end
  redis.call('DEL', job_key)
  if state == 'failed' then redis.call('ZREM', r.dead, id) end
  emit(r.events, r.maxlen, id, 'removed', now)
  return 1
end

-- The reaper's walk over the oldest entries of `state`'s index (at most `budget`): an entry
-- past the policy goes with its record; an entry whose record is gone or changed goes alone
-- (pruned); the walk stops at the first entry that stays. Returns records deleted.
local function trim_finished(r, state, now, budget)
  local index = r.index_prefix .. state
  local pol = r.policy[state]
  local excess, cutoff = 0, nil
  if pol.count > 0 then excess = redis.call('ZCARD', index) - pol.count end
  if pol.age > 0 then cutoff = now - pol.age end
  local head = redis.call('ZRANGE', index, 0, budget - 1, 'WITHSCORES')
  local removed = 0
  for i = 1, #head, 2 do
    local id, score = head[i], tonumber(head[i + 1])
    local over = excess > 0 or (cutoff ~= nil and score <= cutoff)
    if not over then
      local f = redis.call('HMGET', r.job_prefix .. id, 'state', 'finished')
      if f[1] == state and tonumber(f[2]) == score then break end
    end
    redis.call('ZREM', index, id)
    excess = excess - 1
    if over then removed = removed + remove_finished(r, state, id, score, now) end
  end
  return removed
end

-- Called once a job's record is final in `state`, unless a singleton successor took the id
-- over in the same step (that record is not final). Indexes it, then removes at most
-- RETAIN_STEP records past the policy: the oldest past the count (ZPOPMIN: one call each),
-- then any older than the age.
local function keep_finished(r, state, id, now)
  if not r or not r.policy[state] then return end
  local pol, index = r.policy[state], r.index_prefix .. state
  redis.call('ZADD', index, now, id)
  local steps = 0
  if pol.count > 0 then
    local excess = redis.call('ZCARD', index) - pol.count
    while excess > 0 and steps < RETAIN_STEP do
      local e = redis.call('ZPOPMIN', index)
      remove_finished(r, state, e[1], tonumber(e[2]), now)
      excess, steps = excess - 1, steps + 1
    end
  end
  if pol.age > 0 and steps < RETAIN_STEP then
    local old = redis.call('ZRANGEBYSCORE', index, '-inf', fmt(now - pol.age), 'WITHSCORES',
      'LIMIT', 0, RETAIN_STEP - steps)
    for i = 1, #old, 2 do
      redis.call('ZREM', index, old[i])
      remove_finished(r, state, old[i], tonumber(old[i + 1]), now)
    end
  end
end
