--[[ records: several job records and their remaining lifetimes, in one call (read-only).

KEYS[1] job key prefix "{p:q}:job:"

ARGV[1]         n, the number of field names that follow
ARGV[2..n+1]    the fields to read (storage.py RECORD_FIELDS)
ARGV[n+2..]     job ids

Returns: per id, {HMGET of the n fields (all nil when the record is gone), PTTL}.
Events: none (a read).

Why a script rather than a pipeline of HGETALL + PTTL: the model mirror reads thousands of
records per batch, and one reply of nested arrays is parsed by the client's C parser in one
go, where a pipeline costs a Python round of command packing and reply parsing per command.
Why HMGET of named fields rather than HGETALL: the values come back in a known order, so the
client decodes no field names (that was most of its cost per record).
]]

local prefix = KEYS[1]
local n = tonumber(ARGV[1])
local fields = {}
for i = 1, n do
  fields[i] = ARGV[i + 1]
end
local out = {}
for i = n + 2, #ARGV do
  local key = prefix .. ARGV[i]
  out[#out + 1] = {redis.call('HMGET', key, unpack(fields)), redis.call('PTTL', key)}
end
return out
