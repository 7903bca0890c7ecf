--[[ onfail_settle: the failure handler ran for a leased call: delete it, or back it off.

KEYS[1] onfail  ZSET "<id>:<n>" -> due ms
KEYS[2] call    HASH of this call

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] member "<id>:<n>"
ARGV[3] fence: the tries count the caller's claim returned
ARGV[4] ok (1: the handler succeeded; 0: it failed)
ARGV[5] retry in (ms from now, by this script's clock) when not ok
ARGV[6] the handler's error (JSON) when not ok

Returns: 1 settled; 0 fenced out (a later claim holds the call, or it is gone; nothing
written).
Events: none.
]]
--@include common

local onfail_key, call_key = KEYS[1], KEYS[2]
if redis.call('HGET', call_key, 'tries') ~= ARGV[3] then return 0 end
if ARGV[4] == '1' then
  redis.call('DEL', call_key)
  redis.call('ZREM', onfail_key, ARGV[2])
  return 1
end
local now = now_ms(ARGV[1])
redis.call('HSET', call_key, 'last_error', ARGV[6])
redis.call('ZADD', onfail_key, now + math.max(tonumber(ARGV[5]), 0), ARGV[2])
return 1
