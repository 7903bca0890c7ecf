--[[ bc_settle: apply workers' verdicts on deliveries of one group, each fenced by its token.

KEYS[1] log               STREAM
KEYS[2] group key prefix  "{p:bc:name}:g:"

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] group
ARGV[3..] per verdict: kind (complete | retry | dead | release), entry id, token,
          retry_in ms, JSON error

Returns: per verdict "completed" | "retrying" | "failed" | "released" | "lease_lost".
]]
--@include common
--@include bcast

local log, prefix = KEYS[1], KEYS[2]
local now = now_ms(ARGV[1])
local group = ARGV[2]
local out = {}

for i = 3, #ARGV, 5 do
  local kind, pos, token, retry_in, err = ARGV[i], ARGV[i + 1], ARGV[i + 2],
    tonumber(ARGV[i + 3]), ARGV[i + 4]
  if not held(prefix, group, pos, token) then
    out[#out + 1] = 'lease_lost'
  elseif kind == 'complete' then
    forget(log, prefix, group, pos)
    out[#out + 1] = 'completed'
  elseif kind == 'dead' then
    redis.call('HINCRBY', gkey(prefix, group, 'fail'), pos, 1)
    local entry = redis.call('XRANGE', log, pos, pos)
    bury(log, prefix, group, pos, entry[1][2], now, err)
    out[#out + 1] = 'failed'
  else
    if kind == 'retry' then
      redis.call('HINCRBY', gkey(prefix, group, 'fail'), pos, 1)
      redis.call('HSET', gkey(prefix, group, 'err'), pos, err)
    else
      retry_in = 0
    end
    redis.call('ZREM', gkey(prefix, group, 'lease'), pos)
    redis.call('ZADD', gkey(prefix, group, 'retry'), now + retry_in, pos)
    redis.call('XCLAIM', log, group, '~retry', 0, pos, 'JUSTID')
    out[#out + 1] = kind == 'retry' and 'retrying' or 'released'
  end
end
return out
