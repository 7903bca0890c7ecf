--[[ onfail_claim: lease due failure-handler calls to a worker, in one atomic step.

KEYS[1] onfail  ZSET "<id>:<n>" -> due ms (while leased: the lease's end)
KEYS[2] call key prefix "{p:q}:onfail:" (HASH per call)

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] count (calls at most)
ARGV[3] lease (ms)
ARGV[4] worker id (kept on the call: who holds it)

Returns: a flat list, 11 fields per call: member, id, payload, ctype, error, attempts, failed,
due (the lease's end), tries (after + 1: the fence settle checks), last_error, worker.
Events: none (calls are not job transitions).
A member whose HASH is gone (it cannot be, short of a hand-made deletion) is dropped.
]]
--@include common

local onfail_key, call_prefix = KEYS[1], KEYS[2]
local now = now_ms(ARGV[1])
local due_at = now + tonumber(ARGV[3])
local out = {}
local due = redis.call('ZRANGEBYSCORE', onfail_key, '-inf', fmt(now), 'LIMIT', 0, ARGV[2])
for _, member in ipairs(due) do
  local call_key = call_prefix .. member
  local f = redis.call('HMGET', call_key, 'id', 'payload', 'ctype', 'error', 'attempts',
    'failed', 'last_error')
  if f[1] then
    local tries = redis.call('HINCRBY', call_key, 'tries', 1)
    redis.call('HSET', call_key, 'worker', ARGV[4])
    redis.call('ZADD', onfail_key, due_at, member)
    for _, v in ipairs({ member, f[1], f[2], f[3], f[4], f[5], f[6], fmt(due_at), tries,
                         f[7] or '', ARGV[4] }) do
      table.insert(out, v)
    end
  else
    redis.call('ZREM', onfail_key, member)
  end
end
return out
