--[[ claim: lease up to N runnable jobs to one worker, in one atomic step.

There is no instant at which a popped job is not also recorded as active with a lease: the pop
and the lease happen inside this script, so a worker crash after it leaves a job the reaper sees.

KEYS[1] job key prefix "{p:q}:job:"
KEYS[2] queued         ZSET
KEYS[3] scheduled      ZSET
KEYS[4] active         ZSET id -> lease deadline
KEYS[5] wake           LIST
KEYS[6] events         STREAM
KEYS[7] stats          HASH

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] worker id
ARGV[4] count (max jobs to claim)
ARGV[5] lease (ms)
ARGV[6] promote limit (due scheduled jobs moved to queued first)

Returns: { ms until the earliest scheduled job is due (0 if overdue, -1 if none),
           then per job: id, token, attempt, max_attempts, min_backoff, max_backoff, ctype,
           payload }
Events: 'queued' per promoted job, 'active' per claimed job.
Re-pushes the wake marker when queued jobs remain, so the next idle worker wakes too.
]]
--@include common

local job_prefix, queued_key, scheduled_key = KEYS[1], KEYS[2], KEYS[3]
local active_key, wake_key, events_key, stats_key = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local now = now_ms(ARGV[1])
local maxlen, worker = ARGV[2], ARGV[3]
local count, lease = tonumber(ARGV[4]), tonumber(ARGV[5])

promote_due(job_prefix, scheduled_key, queued_key, stats_key, events_key, maxlen, now,
  tonumber(ARGV[6]))

local out = { -1 }
local popped = redis.call('ZPOPMIN', queued_key, count)
local deadline = fmt(now + lease)
for i = 1, #popped, 2 do
  local id = popped[i]
  local job_key = job_prefix .. id
  local f = redis.call('HMGET', job_key, 'state', 'payload', 'ctype', 'max_attempts',
    'min_backoff', 'max_backoff')
  if f[1] == 'queued' then
    local token = redis.call('HINCRBY', job_key, 'token', 1)
    local attempt = redis.call('HINCRBY', job_key, 'attempts', 1)
    redis.call('HSET', job_key, 'state', 'active', 'worker', worker, 'started', fmt(now))
    redis.call('ZADD', active_key, deadline, id)
    emit(events_key, maxlen, id, 'active', now, worker)
    table.insert(out, id)
    table.insert(out, token)
    table.insert(out, attempt)
    table.insert(out, tonumber(f[4]))
    table.insert(out, tonumber(f[5]))
    table.insert(out, tonumber(f[6]))
    table.insert(out, f[3])
    table.insert(out, f[2])
  end
end

if redis.call('ZCARD', queued_key) > 0 then wake(wake_key) end
local first = redis.call('ZRANGE', scheduled_key, 0, 0, 'WITHSCORES')
if first[2] then out[1] = math.max(tonumber(first[2]) - now, 0) end
return out
