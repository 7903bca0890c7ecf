--[[ bc_claim: lease up to N messages of one group to one consumer, in one atomic step.

In order: due retries, deliveries whose lease lapsed, in publish order (a consumer that died:
its pending entries are claimed over with XCLAIM; stalls+1, past max_stalls a dead letter
instead), then unread messages (XREADGROUP ">"). Every delivery gets a lease and a new fencing token,
max(token + 1, token base) (delivery_token in includes/bcast.lua).

KEYS[1] log               STREAM
KEYS[2] groups            HASH group -> ordinal of the last message it read
KEYS[3] missed            HASH group -> missed count
KEYS[4] group key prefix  "{p:bc:name}:g:"

ARGV[1] now (ms; 0 = server TIME)
ARGV[2] group
ARGV[3] consumer (the worker id)
ARGV[4] count
ARGV[5] lease (ms)
ARGV[6] max stalls
ARGV[7] token nonce (0-999, drawn by the claimer: token_base in includes/common.lua)

Returns: -1 for an unknown group; else per delivery: entry id, token (a decimal string),
attempt, message id, payload, content type.
]]
--@include common
--@include bcast
--@include spec

local log, groups, missed, prefix = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = now_ms(ARGV[1])
local group, consumer = ARGV[2], ARGV[3]
local count, lease, max_stalls = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if redis.call('HEXISTS', groups, group) == 0 then return -1 end
local lease_key, retry_key = gkey(prefix, group, 'lease'), gkey(prefix, group, 'retry')
local tok_key, base = gkey(prefix, group, 'tok'), token_base(ARGV[7])
local out, got = {}, 0

local function deliver(pos, flat)
  local f = fields(flat)
  local token = delivery_token(tok_key, pos, base)
  redis.call('ZADD', lease_key, now + lease, pos)
  local attempt = tonumber(redis.call('HGET', gkey(prefix, group, 'fail'), pos) or '0') + 1
  out[#out + 1] = pos
  out[#out + 1] = token
  out[#out + 1] = attempt
  out[#out + 1] = f['id']
  out[#out + 1] = f['p']
  out[#out + 1] = f['ct']
  got = got + 1
end

-- Takes a pending entry over; false when retention deleted it (the delivery ends, missed).
local function take(pos, to)
  local claimed = redis.call('XCLAIM', log, group, to, 0, pos)
  if #claimed == 0 or not claimed[1] or not claimed[1][2] then
    forget(log, prefix, group, pos)
    redis.call('HINCRBY', missed, group, 1)
    return false
  end
  return claimed[1][2]
end

for _, pos in ipairs(redis.call('ZRANGEBYSCORE', retry_key, '-inf', now, 'LIMIT', 0, count)) do
  redis.call('ZREM', retry_key, pos)
  local entry = take(pos, consumer)
  if entry then deliver(pos, entry) end
end

-- Lapsed leases in publish order (entry id "<ms>-<seq>"), no more than the room left (a dead
-- letter made uses it too): of the first LAPSED_SCAN to lapse, so a claim never sorts an
-- unbounded set (past that many lapsed at once, the order holds among those).
local LAPSED_SCAN = 1000
local function published_before(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, bm = tonumber(am), tonumber(bm)
  if am ~= bm then return am < bm end
  return tonumber(as) < tonumber(bs)
end

if got < count then
  local room = count - got
  local lapsed = redis.call('ZRANGEBYSCORE', lease_key, '-inf', now, 'LIMIT', 0,
    math.max(room, LAPSED_SCAN))
  table.sort(lapsed, published_before)
  for i = #lapsed, room + 1, -1 do lapsed[i] = nil end
  for _, pos in ipairs(lapsed) do
    local stalls = redis.call('HINCRBY', gkey(prefix, group, 'stall'), pos, 1)
    local entry = take(pos, stalls > max_stalls and '~dead' or consumer)
    if entry and stalls > max_stalls then
      bury(log, prefix, group, pos, entry, now, DELIVERY_STALLED_ERROR)
    elseif entry then
      deliver(pos, entry)
    end
  end
end

if got < count then
  local read = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count - got,
    'STREAMS', log, '>')
  if read then
    local last
    for _, entry in ipairs(read[1][2]) do
      deliver(entry[1], entry[2])
      last = fields(entry[2])['n']
    end
    if last then redis.call('HSET', groups, group, last) end
  end
end
return out
