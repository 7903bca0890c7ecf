--[[ clean: delete finished records that finished long enough ago, given a batch of ids.

The caller finds candidate ids with SCAN (finished records are indexed nowhere: they expire by
their own TTL); each record is checked and deleted here, so a record that changed since the
scan (a new job under a freed id) is never deleted by mistake.

KEYS[1] job key prefix "{p:q}:job:"
KEYS[2] dead           ZSET (the dead-letter list): a deleted record leaves it
KEYS[3] finished-index prefix (retention): a deleted record leaves its state's index

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] age (ms): records whose 'finished' is at or before now - age go
ARGV[3] states, comma separated (of completed, failed, cancelled)
ARGV[4..] job ids

Returns: the ids of the deleted records (journal mode deletes their entries). Their ids are
free again; a dedup key they held is
free too (a key whose holder record is gone counts as free).
]]
--@include common

local job_prefix = KEYS[1]
local cutoff = now_ms(ARGV[1]) - tonumber(ARGV[2])
local wanted = {}
for state in string.gmatch(ARGV[3], '[^,]+') do wanted[state] = true end
local deleted = {}
for i = 4, #ARGV do
  local job_key = job_prefix .. ARGV[i]
  local f = redis.call('HMGET', job_key, 'state', 'finished')
  if f[1] and wanted[f[1]] and f[2] and tonumber(f[2]) <= cutoff then
    if redis.call('DEL', job_key) == 1 then deleted[#deleted + 1] = ARGV[i] end
    redis.call('ZREM', KEYS[2], ARGV[i])
    redis.call('ZREM', KEYS[3] .. f[1], ARGV[i])
  end
end
return deleted
