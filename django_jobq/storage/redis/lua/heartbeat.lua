--[[ heartbeat: extend the leases of all of one worker's jobs in this queue, in one call.

KEYS[1] job key prefix "{p:q}:job:"
KEYS[2] active         ZSET id -> lease deadline

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] worker id
ARGV[3] lease (ms)
ARGV[4..] pairs: job id, token

Returns: flat pairs (id, token) whose lease this worker no longer holds (reclaimed,
finished or gone).
Events: none (a heartbeat is not a transition).
]]
--@include common

local job_prefix, active_key = KEYS[1], KEYS[2]
local now = now_ms(ARGV[1])
local worker = ARGV[2]
local deadline = fmt(now + tonumber(ARGV[3]))
local lost = {}
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  local f = redis.call('HMGET', job_prefix .. id, 'state', 'token', 'worker')
  if f[1] == 'active' and f[2] == ARGV[i + 1] and f[3] == worker then
    redis.call('ZADD', active_key, 'XX', deadline, id)
  else
    table.insert(lost, id)
    table.insert(lost, ARGV[i + 1])
  end
end
return lost
