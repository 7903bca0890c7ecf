--[[ retain: the reaper's pass of per-queue retention over the finished-record indexes.

The steps that finish jobs trim a few records each (includes/retain.lua); this pass takes the
rest in bounded batches: records older than the policy's age (no finish comes to trim them on
an idle queue), a backlog left by a stricter policy, index entries whose record expired by its
TTL or changed (pruned, so the index never grows past the policy), and the index of a state
whose policy was removed (dropped entry by entry; its records are left to their TTL).

KEYS[1] config  HASH (the policy: 'keep:<state>' fields)
KEYS[2] finished-index prefix "{p:q}:finished:" (state appended: same hash tag)
KEYS[3] job key prefix "{p:q}:job:"
KEYS[4] dead    ZSET (a removed failed record leaves the dead-letter list)
KEYS[5] events  STREAM

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] limit (index entries looked at per state and call)

Returns: { records removed, entries looked at (the caller calls again while it equals the
limit for some state: 1 if so, else 0) }.
Events: 'removed' per record deleted.
]]
--@include common
--@include retain

local now = now_ms(ARGV[1])
local limit = tonumber(ARGV[3])
local r = retention(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[2])
  or { policy = {}, index_prefix = KEYS[2] }
local removed, more = 0, 0
for _, state in ipairs({ 'completed', 'failed', 'cancelled' }) do
  local index = KEYS[2] .. state
  if r.policy[state] then
    local before = redis.call('ZCARD', index)
    removed = removed + trim_finished(r, state, now, limit)
    if before - redis.call('ZCARD', index) >= limit then more = 1 end
  elseif redis.call('ZREMRANGEBYRANK', index, 0, limit - 1) >= limit then
    more = 1
  end
end
return { removed, more }
