--[[ bc_lease: extend leases (heartbeat) or store progress, fenced by each delivery's token.

KEYS[1] group key prefix  "{p:bc:name}:g:"

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] group
ARGV[3] mode: "extend" (ARGV[4] lease ms, then entry id, token pairs) or "progress"
        (ARGV[4] JSON progress, ARGV[5] entry id, ARGV[6] token)

Returns: extend: the entry ids no longer held; progress: 1 stored, 0 not held.
]]
--@include common
--@include bcast

local prefix, group, mode = KEYS[1], ARGV[2], ARGV[3]
local now = now_ms(ARGV[1])
if mode == 'progress' then
  if not held(prefix, group, ARGV[5], ARGV[6]) then return 0 end
  redis.call('HSET', gkey(prefix, group, 'prog'), ARGV[5], ARGV[4])
  return 1
end
local lost = {}
for i = 5, #ARGV, 2 do
  if held(prefix, group, ARGV[i], ARGV[i + 1]) then
    redis.call('ZADD', gkey(prefix, group, 'lease'), 'XX', now + tonumber(ARGV[4]), ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
