-- The event feed's read: each stream's entries after a position, and whether that position is
-- still in the stream, in one atomic step (a trim between a check and a read would hide the
-- gap the check is for).
-- KEYS: event streams. ARGV[1]: count; ARGV[1 + i]: the position in KEYS[i] ('0': the oldest).
-- Returns per stream {lost, entries}: lost is 1 when events after the position may have been
-- removed unread, and then no entries are read.
--
-- The read starts at the position itself (XRANGE is inclusive): when that entry is still
-- there, nothing after it was trimmed (a stream is trimmed from its head). When it is gone,
-- the position is lost if the stream ever lost entries (entries-added > length), or if it is
-- past the newest id the stream ever gave (the stream was deleted and made anew). Redis does
-- not record the last id it trimmed, so a trim that ended exactly at the position is also
-- reported as lost: a false alarm on the safe side, never a silent gap.
local function id_parts(id)
  local ms, seq = string.match(id, '^(%d+)-?(%d*)$')
  return tonumber(ms) or 0, tonumber(seq) or 0
end

local function before(a, b)
  local am, as = id_parts(a)
  local bm, bs = id_parts(b)
  return am < bm or (am == bm and as < bs)
end

local count = tonumber(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  local after = ARGV[i + 1]
  if after == '0' or after == '0-0' then
    local r = redis.call('XREAD', 'COUNT', count, 'STREAMS', key, '0-0')
    out[i] = {0, r and r[1][2] or {}}
  else
    local ok, info = pcall(redis.call, 'XINFO', 'STREAM', key)
    if not ok then
      out[i] = {1, {}}  -- no stream: deleted (obliterated) or lost, with what was after us
    else
      local f = {}
      for j = 1, #info, 2 do f[info[j]] = info[j + 1] end
      local entries = redis.call('XRANGE', key, after, '+', 'COUNT', count + 1)
      local first = entries[1]
      if first and not before(after, first[1]) then  -- the position itself: drop it
        table.remove(entries, 1)
        while #entries > count do table.remove(entries) end
        out[i] = {0, entries}
      elseif f['entries-added'] > f['length'] or before(f['last-generated-id'], after) then
        out[i] = {1, {}}
      else
        while #entries > count do table.remove(entries) end
        out[i] = {0, entries}
      end
    end
  end
end
return out
