--[[ control: queue-wide flow control settings that change more than one thing at once.

KEYS[1] config  HASH (see claim.lua)
KEYS[2] wake    LIST
KEYS[3] active  ZSET (obliterate only)
KEYS[4] generation STRING (obliterate, obliterated): the queue's obliteration counter, odd
        while an obliterate is under way; kept by obliterate (enqueue.lua's fence)

ARGV[1] operation:
  'resume'     unpause, and wake an idle worker (each claim that leaves work behind wakes the
               next, so all idle workers come back one after another)
  'limits'     ARGV[2..] name, value pairs: replace every limit by these (absent: no limit),
               and wake an idle worker, since a raised limit may make jobs claimable
  'obliterate' ARGV[2] force (1): refuse (return -1) while jobs are active unless forced,
               else pause the queue, so that no claim starts while the caller deletes its keys,
               and make the generation odd (a re-creation fenced before it is refused)
  'obliterated' the caller deleted the keys and the journal entries: the generation even

Returns: 1 done, -1 refused.
]]
--@include common

local config_key, wake_key = KEYS[1], KEYS[2]
local op = ARGV[1]
if op == 'resume' then
  redis.call('HDEL', config_key, 'paused')
  wake(wake_key)
elseif op == 'limits' then
  redis.call('HDEL', config_key, 'rate_max', 'rate_window', 'group_rate_max',
    'group_rate_window', 'concurrency')
  if #ARGV > 1 then redis.call('HSET', config_key, unpack(ARGV, 2)) end
  wake(wake_key)
elseif op == 'obliterate' then
  if ARGV[2] ~= '1' and redis.call('ZCARD', KEYS[3]) > 0 then return -1 end
  redis.call('HSET', config_key, 'paused', '1')
  if tonumber(redis.call('GET', KEYS[4]) or '0') % 2 == 0 then redis.call('INCR', KEYS[4]) end
elseif op == 'obliterated' then
  if tonumber(redis.call('GET', KEYS[4]) or '0') % 2 == 1 then redis.call('INCR', KEYS[4]) end
else
  return redis.error_reply('unknown control operation ' .. tostring(op))
end
return 1
