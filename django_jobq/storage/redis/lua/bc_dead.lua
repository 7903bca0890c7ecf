--[[ bc_dead: an operator's retry or purge of a group's dead letters.

KEYS[1] log               STREAM
KEYS[2] group key prefix  "{p:bc:name}:g:"

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] group
ARGV[3] "retry" (back to retrying, due now, attempts and stalls reset; a dead letter whose
        message retention dropped stays dead) | "purge" (deleted)
ARGV[4..] entry ids (none: every dead letter of the group)

Returns: how many moved / were deleted.
]]
--@include common
--@include bcast

local log, prefix = KEYS[1], KEYS[2]
local now = now_ms(ARGV[1])
local group, mode = ARGV[2], ARGV[3]
local dead_key, dd = gkey(prefix, group, 'dead'), gkey(prefix, group, 'dd')
local positions = {}
if #ARGV > 3 then
  for i = 4, #ARGV do positions[#positions + 1] = ARGV[i] end
else
  positions = redis.call('ZRANGE', dead_key, 0, -1)
end
local done = 0
for _, pos in ipairs(positions) do
  if redis.call('ZSCORE', dead_key, pos) then
    local alive = #redis.call('XRANGE', log, pos, pos) > 0
    if mode == 'purge' or alive then
      redis.call('ZREM', dead_key, pos)
      -- (Only a purge removes a dead letter retention dropped, and it removes them all.)
      local by_id = 'id:' .. (redis.call('HGET', dd, pos .. ':m') or '')
      if redis.call('HGET', dd, by_id) == pos then redis.call('HDEL', dd, by_id) end
      redis.call('HDEL', dd, pos .. ':m', pos .. ':p', pos .. ':ct', pos .. ':a', pos .. ':e')
      done = done + 1
    end
    if mode == 'purge' then
      forget(log, prefix, group, pos)
    elseif alive then
      redis.call('HDEL', gkey(prefix, group, 'fail'), pos)
      redis.call('HDEL', gkey(prefix, group, 'stall'), pos)
      redis.call('ZADD', gkey(prefix, group, 'retry'), now, pos)
      redis.call('XCLAIM', log, group, '~retry', 0, pos, 'JUSTID')
    end
  end
end
return done
