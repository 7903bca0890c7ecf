--[[ bc_publish: append messages to a broadcast unless their id is retained, then apply the
retention bounds, in one atomic step.

A message dropped by retention is counted in the `missed` of every group that had not read it
yet or held it active or retrying (those deliveries end); a dead letter keeps its copy, and
the group's `dd` hash maps "id:<message id>" to it (the oldest such), for delivery().

KEYS[1] log          STREAM entry fields: id, n (ordinal), p (payload), ct (content type)
KEYS[2] ids          HASH message id -> entry id (the retained messages' ids)
KEYS[3] meta         HASH n: ordinal of the newest message
KEYS[4] groups       HASH group -> ordinal of the last message it read
KEYS[5] missed       HASH group -> messages dropped before the group handled them
KEYS[6] group key prefix "{p:bc:name}:g:"

ARGV[1] now (ms; 0 = server TIME): the entry id's time part when not older than the newest
ARGV[2] maxlen (0: unbounded)
ARGV[3] max age ms (0: unbounded)
ARGV[4..] per message: id, payload, content type

Returns: per message, outcome ("published" | "duplicate") and entry id.
]]
--@include common
--@include bcast

local log, ids, meta, groups, missed, prefix = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local now = now_ms(ARGV[1])
local maxlen, max_age = tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}

for i = 4, #ARGV, 3 do
  local id = ARGV[i]
  local held_by = redis.call('HGET', ids, id)
  if held_by then
    out[#out + 1] = 'duplicate'
    out[#out + 1] = held_by
  else
    local n = redis.call('HINCRBY', meta, 'n', 1)
    local ok, pos = pcall(redis.call, 'XADD', log, fmt(now) .. '-*', 'id', id, 'n', n,
      'p', ARGV[i + 1], 'ct', ARGV[i + 2])
    if not ok then  -- the clock is behind the newest entry: Redis picks the next id
      pos = redis.call('XADD', log, '*', 'id', id, 'n', n, 'p', ARGV[i + 1], 'ct', ARGV[i + 2])
    end
    redis.call('HSET', ids, id, pos)
    out[#out + 1] = 'published'
    out[#out + 1] = pos
  end
end

-- Retention: the oldest entries past maxlen, and every entry older than max_age.
local doomed = {}
if maxlen > 0 then
  local excess = redis.call('XLEN', log) - maxlen
  if excess > 0 then doomed = redis.call('XRANGE', log, '-', '+', 'COUNT', excess) end
end
if max_age > 0 then
  local after = #doomed > 0 and ('(' .. doomed[#doomed][1]) or '-'
  local old = redis.call('XRANGE', log, after, '(' .. fmt(now - max_age) .. '-0')
  for _, e in ipairs(old) do doomed[#doomed + 1] = e end
end
if #doomed > 0 then
  local reads = redis.call('HGETALL', groups)
  for _, entry in ipairs(doomed) do
    local pos, f = entry[1], fields(entry[2])
    local n = tonumber(f['n'])
    redis.call('HDEL', ids, f['id'])
    for g = 1, #reads, 2 do
      local group = reads[g]
      if n > tonumber(reads[g + 1]) then  -- never read: the group moves past it
        redis.call('HINCRBY', missed, group, 1)
        reads[g + 1] = fmt(n)
        redis.call('HSET', groups, group, reads[g + 1])
      elseif redis.call('ZSCORE', gkey(prefix, group, 'dead'), pos) then
        redis.call('XACK', log, group, pos)  -- the dead letter keeps its copy
        redis.call('HSETNX', gkey(prefix, group, 'dd'), 'id:' .. f['id'], pos)
      elseif redis.call('HEXISTS', gkey(prefix, group, 'tok'), pos) == 1 then
        redis.call('HINCRBY', missed, group, 1)  -- active or retrying: that delivery ends
        forget(log, prefix, group, pos)
      end
    end
    redis.call('XDEL', log, pos)
  end
end
return out
