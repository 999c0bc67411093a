-- take_arith.lua: exact integer arithmetic on Lua's numbers. Reads and
-- writes no state: every function here is pure. The release script
-- (release.lua) begins with it too, for a true-up's debt.
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
