-- take.lua decides one request against one or more zones at once, and
-- charges them all only if every one allows it. It is algorithms.Decide
-- (algorithms/algorithms.go) in Lua, bit for bit.
--
-- KEYS[i]  counters of the i-th zone and key: a hash with fields
--          w (window index), c (cost counted in window w) and
--          p (cost counted in window w-1).
-- ARGV[1]  "" to use the server clock (TIME), or a time in ms since the
--          epoch; tests drive the shared test vectors with it.
-- ARGV[2]  "1" to charge the zones when all allow, "0" to decide only.
-- ARGV[3 + 4*(i-1) ...] for the i-th zone: algorithm ("f" fixed window,
--          "s" sliding tail), limit, window (ms) and cost.
--
-- Returns {now, all allowed (1/0), then for each zone: w, c, p as stored
-- before this request (0 when absent) and whether the zone alone allows
-- the request (1/0)}.
--
-- Lua numbers are doubles: integers are exact below 2^53, which every
-- count, limit, cost, window and time here stays under. Only the sliding
-- tail's products prev*(window-elapsed) and (room+1)*window can pass 2^53
-- (a limit near 2^31 times a window of days in ms), so they are compared
-- exactly in 24-bit limbs.

local B = 16777216 -- 2^24

-- limbs splits x (0 <= x < 2^53) into three 24-bit limbs, low first.
local function limbs(x)
  local l0 = x % B
  x = (x - l0) / B
  local l1 = x % B
  return l0, l1, (x - l1) / B
end

-- mul returns a*b as six 24-bit limbs, low first. Every partial sum stays
-- below 2^52, so the arithmetic is exact.
local function mul(a, b)
  local a0, a1, a2 = limbs(a)
  local b0, b1, b2 = limbs(b)
  local r = {a0 * b0, a0 * b1 + a1 * b0, a0 * b2 + a1 * b1 + a2 * b0, a1 * b2 + a2 * b1, a2 * b2, 0}
  for i = 1, 5 do
    local carry = math.floor(r[i] / B)
    r[i] = r[i] - carry * B
    r[i + 1] = r[i + 1] + carry
  end
  return r
end

-- less reports whether the limb numbers x < y.
local function less(x, y)
  for i = 6, 1, -1 do
    if x[i] ~= y[i] then
      return x[i] < y[i]
    end
  end
  return false
end

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local charge = ARGV[2] == '1'

local out = {now, 1}
local all = true
local n = #KEYS
local writes = {}

for i = 1, n do
  local a = 3 + 4 * (i - 1)
  local sliding = ARGV[a] == 's'
  local limit = tonumber(ARGV[a + 1])
  local w = tonumber(ARGV[a + 2])
  local cost = tonumber(ARGV[a + 3])

  -- The window index floor(now/w), corrected in case the division rounded.
  local idx = math.floor(now / w)
  if idx * w > now then
    idx = idx - 1
  elseif (idx + 1) * w <= now then
    idx = idx + 1
  end
  local elapsed = now - idx * w

  local v = redis.call('HMGET', KEYS[i], 'w', 'c', 'p')
  local sw = tonumber(v[1]) or 0
  local sc = tonumber(v[2]) or 0
  local sp = tonumber(v[3]) or 0

  -- Counts written in a later window than the clock says (it stepped
  -- back): decide as of the start of their window rather than forget them.
  if v[1] and sw > idx then
    idx = sw
    elapsed = 0
  end

  -- Roll the stored counts forward to window idx.
  local cur, prev = 0, 0
  if v[1] and sw == idx then
    cur, prev = sc, sp
  elseif v[1] and sw == idx - 1 then
    prev = sc
  end

  local ok
  local room = limit - cost - cur
  if room < 0 then
    ok = false
  elseif sliding and prev > 0 then
    -- floor(prev*(w-elapsed)/w) <= room  <=>  prev*(w-elapsed) < (room+1)*w
    ok = less(mul(prev, w - elapsed), mul(room + 1, w))
  else
    ok = true
  end

  all = all and ok
  out[#out + 1] = sw
  out[#out + 1] = sc
  out[#out + 1] = sp
  out[#out + 1] = ok and 1 or 0

  -- The counters matter until the window ends, or for a sliding tail
  -- until the next one ends, since it is weighed as the previous window.
  local ttl = w - elapsed
  if sliding then
    ttl = ttl + w
  end
  writes[i] = {cur + cost, prev, idx, ttl}
end

if not all then
  out[2] = 0
elseif charge then
  for i = 1, n do
    local wr = writes[i]
    redis.call('HSET', KEYS[i], 'w', wr[3], 'c', wr[1], 'p', wr[2])
    redis.call('PEXPIRE', KEYS[i], wr[4])
  end
end
return out
