--[[ unwait: a caller of enqueue_and_wait gives up (its wait timed out).

Each registered waiter (enqueue with the waiter flag: `waiters + 1` on the job) is sent one
reply on the job's reply list when the job finishes. A waiter that gives up withdraws its
registration here, so the finish pushes no reply that nobody will read; if the job finished
between the waiter's last BLPOP and this step, the reply pushed for it is taken instead.

KEYS[1] job   HASH
KEYS[2] done  LIST (replies for waiters)

Returns: the reply 'state\n<result or error>' when the job is finished and one is left for
this waiter; false otherwise (the registration, if still counted, is withdrawn).
Events: none.
]]

local f = redis.call('HMGET', KEYS[1], 'state', 'waiters')
local state = f[1]
if state == 'completed' or state == 'failed' or state == 'cancelled' then
  return redis.call('LPOP', KEYS[2])
end
if tonumber(f[2] or '0') > 0 then redis.call('HINCRBY', KEYS[1], 'waiters', -1) end
return false
