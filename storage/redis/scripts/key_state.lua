-- key_state.lua reads what the store holds for one zone and key, for the
-- admin API.
--
-- KEYS[1]  the counter hash (see take.lua).
--
-- Returns {now (the server's clock, ms), w, c, p (0 when absent), the
-- override's limit (0 when none is in force), its end (ms; 0 for never),
-- when the key's ban ends (ms; 0 when it is not banned), the costs in
-- flight iw, ic and ip as stored (0 when absent; see take_bans.lua), and
-- a sliding window's ring counts, if any (see take_sliding_window.lua)}.
-- The counts, the override and the costs in flight are answered as the
-- strings Redis holds: a wide zone's run past 2^53 (take_wide.lua).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('HMGET', KEYS[1], 'w', 'c', 'p', 'o', 'ox', 'b', 'iw', 'ic', 'ip', 'r')
local o, ox = v[4] or 0, tonumber(v[5]) or 0
if ox ~= 0 and ox <= now then
  o, ox = 0, 0
end
local b = tonumber(v[6]) or 0
if b <= now then
  b = 0
end
local out = {now, tonumber(v[1]) or 0, v[2] or 0, v[3] or 0, o, ox, b,
  tonumber(v[7]) or 0, v[8] or 0, v[9] or 0}
for c in string.gmatch(v[10] or '', '%d+') do
  out[#out + 1] = tonumber(c)
end
return out
