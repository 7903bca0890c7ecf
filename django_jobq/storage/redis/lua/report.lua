--[[ report: the running attempt stores its progress and/or a log line, lease holder only.

KEYS[1] job     HASH (fields 'progress': JSON bytes; 'logs': JSON array of [ms, line])
KEYS[2] events  STREAM

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] events MAXLEN
ARGV[3] job id
ARGV[4] fencing token of the caller's claim
ARGV[5] progress JSON ('' = no change)
ARGV[6] '1' when ARGV[7] is a log line to append
ARGV[7] log line
ARGV[8] log lines kept (older ones drop off)

Returns: 1 stored; 0 lease lost (nothing written).
Events: 'progress', 'log'.
Log lines live in the job hash, so they expire, move and are deleted with the record.
]]
--@include common

local job_key, events_key = KEYS[1], KEYS[2]
local f = redis.call('HMGET', job_key, 'state', 'token', 'worker', 'logs')
if f[1] ~= 'active' or f[2] ~= ARGV[4] then return 0 end

local now = now_ms(ARGV[1])
if ARGV[5] ~= '' then
  redis.call('HSET', job_key, 'progress', ARGV[5])
  emit(events_key, ARGV[2], ARGV[3], 'progress', now, f[3], ARGV[5])
end
if ARGV[6] == '1' then
  local logs = f[4] and cjson.decode(f[4]) or {}
  table.insert(logs, {now, ARGV[7]})
  local keep = tonumber(ARGV[8])
  while #logs > keep do table.remove(logs, 1) end
  redis.call('HSET', job_key, 'logs', cjson.encode(logs))
  emit(events_key, ARGV[2], ARGV[3], 'log', now, f[3])
end
return 1
