--[[ cancel: scheduled / queued / retrying / blocked -> cancelled, O(log n).

KEYS[1] job           HASH
KEYS[2] queued        ZSET
KEYS[3] scheduled     ZSET
KEYS[4] events        STREAM
KEYS[5] stats         HASH
KEYS[6] done          LIST (outcome for waiters)
KEYS[7] successor     HASH (the id's blocked singleton successor, if any)
KEYS[8] blocked       SET of ids with a successor
KEYS[9] dedup prefix  "{p:q}:dedup:"
KEYS[10] job prefix, KEYS[11] dead ZSET, KEYS[12] config HASH, KEYS[13] finished-index
        prefix (retention, see includes/retain.lua)

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] job id
ARGV[4] for an active job: '' leave it alone; 'stop' / 'force' mark it (field 'cancel') so its
        worker stops it (cooperatively / by killing it), and return 'requested'

Returns: 'cancelled' (now or already), 'requested', 'not_found', 'active', 'completed' or
'failed'.
An id with a blocked successor: the successor is cancelled (deleted) and the record is left
as it is (an active run continues). Otherwise the record is cancelled and stays
(deduplicating the id) until its result_ttl passes (or the queue's retention removes it); a simple-mode dedup key it holds is freed.
Events: 'cancelled'.
]]
--@include common
--@include sched
--@include retain

local job_key, queued_key, scheduled_key = KEYS[1], KEYS[2], KEYS[3]
local events_key, stats_key, done_key = KEYS[4], KEYS[5], KEYS[6]
local succ_key, blocked_key, dedup_prefix = KEYS[7], KEYS[8], KEYS[9]
local id = ARGV[3]
local f = redis.call('HMGET', job_key, 'state', 'succ', 'dedup', 'dmode')
local state = f[1]
if not state then return 'not_found' end

local now = now_ms(ARGV[1])
if f[2] == '1' then
  redis.call('DEL', succ_key)
  redis.call('HDEL', job_key, 'succ')
  redis.call('SREM', blocked_key, id)
  emit(events_key, ARGV[2], id, 'cancelled', now)
  return 'cancelled'
end
if state == 'active' and ARGV[4] ~= '' then
  redis.call('HSET', job_key, 'cancel', ARGV[4])
  return 'requested'
end
if state == 'active' or state == 'completed' or state == 'failed' or state == 'cancelled' then
  return state
end

if state == 'retrying' then redis.call('HINCRBY', stats_key, 'retrying', -1) end
redis.call('ZREM', queued_key, id)
redis.call('ZREM', scheduled_key, id)
finish(job_key, done_key, stats_key, 'cancelled', '', now)
if f[3] then sched().release_dedup(dedup_prefix, id, f[3], f[4]) end
emit(events_key, ARGV[2], id, 'cancelled', now)
keep_finished(retention(KEYS[12], KEYS[13], KEYS[10], KEYS[11], events_key, ARGV[2]),
  'cancelled', id, now)
return 'cancelled'
