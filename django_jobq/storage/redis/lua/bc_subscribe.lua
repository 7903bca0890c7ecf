--[[ bc_subscribe: create a consumer group (one per subscriber group) unless it exists.

KEYS[1] log      STREAM
KEYS[2] meta     HASH n
KEYS[3] groups   HASH group -> ordinal of the last message it read
KEYS[4] missed   HASH group -> missed count

ARGV[1] group
ARGV[2] start: "now" | "earliest" | epoch ms (messages published at or after it)

Returns: 1 created, 0 it existed (it keeps its position).
]]

local log, meta, groups, missed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, start = ARGV[1], ARGV[2]
if redis.call('HEXISTS', groups, group) == 1 then return 0 end
local id, read = '0', 0
if start == 'now' then
  id, read = '$', tonumber(redis.call('HGET', meta, 'n') or '0')
elseif start ~= 'earliest' then
  local before = redis.call('XREVRANGE', log, '(' .. start .. '-0', '-', 'COUNT', 1)
  if #before > 0 then
    id = before[1][1]
    for i = 1, #before[1][2], 2 do
      if before[1][2][i] == 'n' then read = tonumber(before[1][2][i + 1]) end
    end
  end
end
redis.call('XGROUP', 'CREATE', log, group, id, 'MKSTREAM')
redis.call('HSET', groups, group, read)
redis.call('HSET', missed, group, 0)
return 1
