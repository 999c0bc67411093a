-- arith.lua: exact integer arithmetic on Lua's numbers. Reads and
-- writes no state: every function here is pure. The finish script
-- (finish.lua) begins with it too, for a true-up's debt.
--
-- Lua numbers are doubles: integers are exact below 2^53, which every
-- count, limit, cost, window and time here stays under. Only products can
-- pass 2^53 (a limit near 2^31 times a window of days in ms): the sliding
-- tail's prev*(window-elapsed) and (room+1)*window are compared exactly
-- in 24-bit limbs, and the products that muldiv divides (gcra's
-- burst*window, a lease's room) are divided exactly in them.

local B = 16777216 -- 2^24
local EXACT = 9007199254740992 -- 2^53

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

-- muldiv returns floor(a*b/d) and a*b mod d, exactly, for 0 <= a, b <
-- 2^53 and 0 < d <= 2^44 whose quotient is below 2^53. d is a limit
-- (below 2^31) or a window in ms, and no window reaches 2^44 ms: a
-- window is a Go duration, which ends at 2^63 ns (292 years, 9.3e12 ms).
--
-- Why it is exact: for integers y and d with y + d <= 2^53, y/d in
-- doubles rounds to q + 1 only if 1/d, the least it falls short of it,
-- is at most half a unit in the last place of q + 1, which takes
-- d*(q + 1) >= 2^53; but d*(q + 1) <= y + d - 1. So floor(y/d) is the
-- true quotient, and y - q*d the true remainder. A product past 2^53 - d
-- is divided limb by limb, a byte at a time: each partial dividend is
-- below 256*d, and with d <= 2^44, 257*d <= 2^53 holds.
local BYTES = {65536, 256, 1}
local function muldiv(a, b, d)
  local x = a * b
  if x <= EXACT - d then
    local q = math.floor(x / d)
    return q, x - q * d
  end
  local m = mul(a, b)
  local q, r = 0, 0
  for i = 6, 1, -1 do
    local v = m[i]
    for _, p in ipairs(BYTES) do
      local part = math.floor(v / p)
      v = v - part * p
      local cur = r * 256 + part
      local qd = math.floor(cur / d)
      r = cur - qd * d
      q = q * 256 + qd
    end
  end
  return q, r
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

-- floordiv returns floor(x/d) for integers x and d > 0 below 2^53,
-- corrected in case the division rounded.
local function floordiv(x, d)
  local q = math.floor(x / d)
  if q * d > x then
    q = q - 1
  elseif (q + 1) * d <= x then
    q = q + 1
  end
  return q
end

-- Wide counts. A wide zone (storage.Request.Wide: a zone priced in money,
-- which counts picodollars) has counts, limits and costs up to 2^63 - 1,
-- past 2^53, where doubles stop being exact. They stay decimal strings,
-- as Redis keeps them and the caller writes them, and are added,
-- subtracted and compared exactly in limbs of 10^7, low first (three
-- hold 2^63), whose products with a window in ms (below 10^14, two
-- limbs) sum below 2^53. The functions below take a count as a decimal
-- string, or as a number below 2^53 (the 0 a key starts from), and give
-- decimal strings.

local D = 10000000 -- 10^7
local WIDE_MAX = '9223372036854775807' -- 2^63 - 1

-- limbsOf splits the count x into limbs.
local function limbsOf(x)
  if type(x) == 'number' then
    x = string.format('%.0f', x)
  end
  local a = {}
  for i = #x, 1, -7 do
    a[#a + 1] = tonumber(string.sub(x, math.max(i - 6, 1), i))
  end
  return a
end

-- decimalOf writes the limbs a as a decimal string.
local function decimalOf(a)
  local n = #a
  while n > 1 and a[n] == 0 do
    n = n - 1
  end
  local parts = {string.format('%d', a[n])}
  for i = n - 1, 1, -1 do
    parts[#parts + 1] = string.format('%07d', a[i])
  end
  return table.concat(parts)
end

-- cmpLimbs returns -1, 0 or 1 as the limbs a <, = or > b.
local function cmpLimbs(a, b)
  for i = math.max(#a, #b), 1, -1 do
    local x, y = a[i] or 0, b[i] or 0
    if x ~= y then
      return x < y and -1 or 1
    end
  end
  return 0
end

-- addLimbs returns a + b.
local function addLimbs(a, b)
  local r, carry = {}, 0
  for i = 1, math.max(#a, #b) do
    local v = (a[i] or 0) + (b[i] or 0) + carry
    carry = v >= D and 1 or 0
    r[i] = v - carry * D
  end
  r[#r + 1] = carry
  return r
end

-- mulLimbs returns a * m, for an integer 0 <= m < 10^14.
local function mulLimbs(a, m)
  local m0 = m % D
  local m1 = (m - m0) / D
  local r = {}
  for i = 1, #a + 3 do
    r[i] = 0
  end
  for i = 1, #a do
    r[i] = r[i] + a[i] * m0
    r[i + 1] = r[i + 1] + a[i] * m1
  end
  for i = 1, #r - 1 do
    local carry = math.floor(r[i] / D)
    r[i] = r[i] - carry * D
    r[i + 1] = r[i + 1] + carry
  end
  return r
end

local MAX_LIMBS = limbsOf(WIDE_MAX)

-- wideCmp returns -1, 0 or 1 as the counts x <, = or > y.
local function wideCmp(x, y)
  return cmpLimbs(limbsOf(x), limbsOf(y))
end

-- wideAdd returns x + y, or 2^63 - 1 if that is less: a count stops there.
local function wideAdd(x, y)
  local r = addLimbs(limbsOf(x), limbsOf(y))
  if cmpLimbs(r, MAX_LIMBS) > 0 then
    return WIDE_MAX
  end
  return decimalOf(r)
end

-- wideSub returns x - y, or 0 if that is less.
local function wideSub(x, y)
  local a, b = limbsOf(x), limbsOf(y)
  if cmpLimbs(a, b) <= 0 then
    return '0'
  end
  local r, borrow = {}, 0
  for i = 1, #a do
    local v = a[i] - (b[i] or 0) - borrow
    borrow = v < 0 and 1 or 0
    r[i] = v + borrow * D
  end
  return decimalOf(r)
end

-- wideMin returns the lesser of the counts x and y.
local function wideMin(x, y)
  if wideCmp(x, y) <= 0 then
    return x
  end
  return y
end

-- wideFits reports whether used + cost <= limit, for wide counts.
local function wideFits(used, cost, limit)
  return cmpLimbs(addLimbs(limbsOf(used), limbsOf(cost)), limbsOf(limit)) <= 0
end

-- plus returns x + y, and minus x - y or 0 if that is less, for counts of
-- any zone: numbers, or a wide zone's decimal strings, which they add and
-- subtract exactly.
local function plus(x, y)
  if type(x) == 'number' and type(y) == 'number' then
    return x + y
  end
  return wideAdd(x, y)
end

local function minus(x, y)
  if type(x) == 'number' and type(y) == 'number' then
    return math.max(x - y, 0)
  end
  return wideSub(x, y)
end
