-- Shared by the broadcast scripts (bc_*.lua). A broadcast's keys share the hash tag
-- "{prefix:bc:name}"; a group's keys are the group key prefix (passed in KEYS, so it carries
-- the tag) plus the group name (validated like a queue name) plus a suffix:
--   :tok   HASH pos -> fencing token of the newest claim (kept until the group is done with it)
--   :fail  HASH pos -> failed attempts          :stall HASH pos -> lapsed leases
--   :lease ZSET pos -> lease deadline (active)  :retry ZSET pos -> due ms (retrying)
--   :dead  ZSET pos -> failed at (dead letters) :dd    HASH "<pos>:<field>" -> dead letter copy,
--          and "id:<message id>" -> pos of the oldest dead letter of that id whose message
--          retention dropped (bc_publish; for delivery())
--   :err   HASH pos -> last JSON error          :prog  HASH pos -> last JSON progress
-- Retrying and dead entries stay in the consumer group's pending list under the reserved
-- consumers "~retry" and "~dead", so a stream entry is acknowledged (XACK) only once the
-- group is done with it.

local function gkey(prefix, group, suffix) return prefix .. group .. ':' .. suffix end

-- Stream entry fields (a flat array) as a table.
local function fields(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

-- The fencing token of a new claim of the delivery at `pos`: max(previous + 1, base), `base`
-- from token_base (common.lua) as a job claim's. The `tok` counter alone would restart at 1
-- for a group unsubscribed (its keys deleted) and subscribed again, and a worker still holding
-- a lease of the old group would pass the new group's fence. A 19-digit decimal string, as
-- next_token's.
local function delivery_token(tok_key, pos, base)
  local prev = redis.call('HGET', tok_key, pos)
  if prev and (#prev > #base or (#prev == #base and prev >= base)) then
    redis.call('HINCRBY', tok_key, pos, 1)  -- exact in Redis; a Lua number is not past 2^53
    return redis.call('HGET', tok_key, pos)
  end
  redis.call('HSET', tok_key, pos, base)
  return base
end

-- Whether (pos, token) is the newest claim of an active delivery.
local function held(prefix, group, pos, token)
  return redis.call('HGET', gkey(prefix, group, 'tok'), pos) == token
    and redis.call('ZSCORE', gkey(prefix, group, 'lease'), pos) ~= false
end

-- Forget everything the group holds about one delivery (its dead letter copy excepted).
local function forget(log, prefix, group, pos)
  redis.call('XACK', log, group, pos)
  redis.call('ZREM', gkey(prefix, group, 'lease'), pos)
  redis.call('ZREM', gkey(prefix, group, 'retry'), pos)
  for _, s in ipairs({'tok', 'fail', 'stall', 'err', 'prog'}) do
    redis.call('HDEL', gkey(prefix, group, s), pos)
  end
end

-- Make a delivery a dead letter: a copy of the message (it outlives retention), the error.
local function bury(log, prefix, group, pos, entry, now, err)
  local f = fields(entry)
  local attempts = redis.call('HGET', gkey(prefix, group, 'fail'), pos) or '0'
  redis.call('HSET', gkey(prefix, group, 'dd'), pos .. ':m', f['id'], pos .. ':p', f['p'],
    pos .. ':ct', f['ct'], pos .. ':a', attempts, pos .. ':e', err)
  redis.call('ZADD', gkey(prefix, group, 'dead'), now, pos)
  redis.call('ZREM', gkey(prefix, group, 'lease'), pos)
  redis.call('XCLAIM', log, group, '~dead', 0, pos, 'JUSTID')
end
