-- take.lua decides a batch of requests, one after the other, each against
-- one or more zones, and charges a request's zones only if every one of them
-- allows it. Each decision is algorithms.Decide (algorithms/algorithms.go)
-- in Lua, bit for bit, and sees the charges of the requests before it.
--
-- KEYS     the counters of each entry's zones, entry after entry (a
--          concurrency zone's followed by its holders' set, below): a
--          hash per zone and key with fields w (window index), c (cost
--          counted in window w), p (cost counted in window w-1) and t (the
--          instant, in ms of the script's clock, the key was last set to
--          expire at); and, when the admin API set a per-key limit, o (the
--          limit) and ox (when it ends, in ms; 0 for never). While the
--          override is in force it replaces the request's limit, and the
--          key's expiry is the admin call's to set, not this script's.
--          And b: when the key's ban ends (ms), once a zone with a ban
--          rejected it; and, for a zone that bans and gives costs back,
--          iw, ic and ip: the costs of its requests still in flight (see
--          Bans). A sliding window (below) keeps its ring in w (the
--          current sub-window's index) and r.
-- ARGV[1]  "" to use the server clock (TIME), or a time in ms since the
--          epoch; tests drive the shared test vectors with it.
-- ARGV[2]  N, the live instances sharing the store, for leases (below).
-- Then for each entry, which stands for m requests that ask the same (the
--          same zones, keys and arguments): "1" to charge their zones
--          when all allow a request, "0" to decide only; the number n of
--          zones; m; and for each zone:
--          algorithm ("f" fixed window, "s" sliding tail, "w" sliding
--          window, "g" gcra, "c" concurrency), limit, window (ms; for
--          concurrency the lease), cost, one more: gcra's burst (0: the
--          limit), a sliding window's buckets, concurrency's holder (see
--          below), "" otherwise; the lease asked for: how
--          many units beyond the cost the instance would like to spend
--          later on its own (0 for none); the ban (ms; 0 for none); and
--          "1" if the zone keeps its costs in flight (it bans, and gives
--          costs back: count_status), "0" if not.
--
-- Bans: a zone with a ban rejects every request while the key's ban has
-- not ended, whatever its counts; and when it rejects a request of a key
-- that is not banned, the key is banned from now for the zone's ban. The
-- ban lives in the key's hash, beside its counts, which then live at
-- least as long. A zone that keeps its costs in flight bans only if the
-- key's settled count alone leaves the request no room: as
-- algorithms/inflight.go keeps them, iw, ic and ip are the costs taken in
-- window iw (of the zone's window) and in window iw-1 whose requests are
-- not done yet (refund.lua takes them off), which Settled takes off the
-- counts before deciding again; a refusal only for costs in flight bans
-- nothing.
--
-- Leases: when an entry of one request (m = 1) is allowed and charged, each
-- zone that asked for a lease is charged up to that many more units, but
-- never more than floor(room / 2N), where room is what the zone has left
-- after the request: the instance spends them later without a call. Every
-- leased unit is counted here before it is spent, and the last units of a
-- window are left to be decided one at a time.
--
-- A sliding window of n buckets (algorithms/sliding.go) keeps the index
-- of its current sub-window in w and the counts of that sub-window and
-- the n before it in r, "c0,c1,...,cn", sub-window k's at position
-- k mod (n+1). For its zones the answer's w, c and p are not the stored
-- counts but what the caller needs to rebuild each request's decision:
-- the sub-window decided in, what the key used before the entry, and the
-- retry instant of the entry's first request rejected (0 if none was).
--
-- GCRA keeps its theoretical arrival time TAT in the same fields: w its
-- whole ms, c its fraction in units of 1/p ms (algorithms/gcra.go).
-- Concurrency keeps the units held in c, and each holder in a sorted set
-- beside the hash, scored by when its lease ends; a holder is named
-- "<instance>:<request>/<cost>". The set comes in KEYS right after the
-- hash, as every key a script touches must (Redis Cluster routes the call
-- by them, and replicates its effects on them): the caller names it
-- prefix{key}h:zone, which no counter hash can be named, in the hash's
-- slot by the same tag. Holders whose lease ended (their instance died
-- without releasing) are removed, and their cost taken off c, before the
-- key is decided.
--
-- Returns {now, then for each entry: how many of its m requests were
-- allowed (they are the first ones: once one is rejected, the rest are
-- decided against the same counters), and for each zone: w, c, p as
-- stored before the entry (0 when absent), whether the zone alone allows
-- the entry's first request not allowed (1/0; 1 when all were), the limit
-- it was decided against, the units leased (0 when none), b as stored
-- before the entry (0 when absent), and 1 if the zone keeps its costs in
-- flight, rejected that request, and would have allowed it on the
-- settled count alone (so it banned nothing), 0 otherwise}. The caller
-- rebuilds what each of the entry's requests saw by charging them one
-- after the other, as algorithms.Decide does, and banning as this script
-- does. An entry for many identical requests (one hot key under load)
-- costs little more than one for a single request: its arguments are
-- read once and its answer is eight numbers a zone.
--
-- Each key is read once and written at most once per call, after all
-- requests are decided, with the counts they left. Its expiry is set only
-- when it must move later: within a window it is already right.
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

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local instances = math.max(tonumber(ARGV[2]) or 1, 1)

local out = {now}
local o = 1

-- The counters of every key the call touches, as the requests so far left
-- them, twelve slots per key from s[at[key]]: the key, w (false when Redis
-- does not hold the key), c, p, t, what to write at the end (0 nothing, 1
-- the counts, 2 the counts and a later expiry), the override in force
-- (false if none), the holders' set of a concurrency key (false for
-- others), b (0 when absent), and iw, ic, ip (0 when absent). Flat arrays
-- keep the tables per call few.
local at, s, ns = {}, {}, 0
-- The rings of sliding-window keys, by where their counters are: the
-- counts as a table (position k mod (n+1) at index k mod (n+1) + 1), as
-- the requests so far left them.
local rings = {}
-- The keys this call banned, and those whose costs in flight it changed,
-- by where their counters are.
local banned, flying = {}, {}
-- The current entry's zones, nine slots per zone: where its key's
-- counters are, algorithm, limit, window, cost, the zone's extra argument,
-- the lease asked for, the ban, and whether it keeps its costs in flight.
local zs = {}
-- What charging the current request would write, six slots per zone:
-- where its key's counters are, w, c, p and t, and the holder to add
-- (false if none).
local pend = {}

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

-- substart returns when sub-window k of a window of w ms cut in n starts:
-- ceil(k*w/n). k*w stays below 2^53 (k is about now*n/w).
local function substart(k, w, n)
  return -floordiv(-k * w, n)
end

-- ringOf returns the ring at s[j] rolled forward to sub-window idx for n
-- buckets, as a new table, and idx, which is the stored index if the
-- clock reads an earlier one. A ring kept for another n is folded into
-- the current sub-window whole: it counts for longer, never shorter. A
-- ring more than a window ahead was kept for a shorter window (the zone's
-- window grew in a reload): its counts start afresh.
local function ringOf(j, n, idx)
  local old, sw = rings[j], s[j + 1] or 0
  local r = {}
  for i = 1, n + 1 do
    r[i] = 0
  end
  if #old == n + 1 and sw > idx + n then
    return r, idx
  end
  if #old ~= n + 1 then
    local total = 0
    for _, c in ipairs(old) do
      total = total + c
    end
    r[idx % (n + 1) + 1] = total
    return r, idx
  end
  if sw > idx then
    idx = sw
  end
  if idx - sw <= n then
    for i = 1, n + 1 do
      r[i] = old[i]
    end
    for k = sw + 1, idx do
      r[k % (n + 1) + 1] = 0
    end
  end
  return r, idx
end

-- tatOf reads a gcra key's TAT as its hash holds it (w, c, p: ms, and a
-- fraction c/p of a ms) as (ms, fraction in 1/limit ms), limit being the
-- rate it is decided at now: a fraction kept for another limit is
-- rescaled, rounded down and kept below a whole ms.
local function tatOf(sw, sc, sp, limit)
  local ms, f = sw or 0, 0
  if sp > 0 and sc > 0 then
    if sp == limit then
      f = sc
    else
      f = math.min(muldiv(sc, limit, sp), limit - 1)
    end
  end
  return ms, f
end

-- decide decides one zone of a request against the counters at s[j], as
-- the requests before it left them. It returns whether the zone allows
-- the request, and the w, c, p and t that charging it would write, and
-- the holder to add (false if none).
local function decide(j, alg, limit, w, cost, extra)
  local sw, sc, sp = s[j + 1], s[j + 2], s[j + 3]
  if alg == 'g' then
    -- GCRA, as algorithms/gcra.go decides it: instants are kept as
    -- (ms, fraction in 1/limit ms).
    local burst = tonumber(extra)
    if burst == 0 then
      burst = limit
    end
    local tms, tf = tatOf(sw, sc, sp, limit)
    if tms < now then
      tms, tf = now, 0
    end
    if cost > burst then
      return false
    end
    local bq, br = muldiv(burst, w, limit)
    local fms, ff = now + bq, br -- now + burst*T
    local cq, cr = muldiv(cost, w, limit)
    local nms, nf = tms + cq, tf + cr
    if nf >= limit then
      nms, nf = nms + 1, nf - limit
    end
    -- The key matters until its TAT, when its bucket is full again.
    return nms < fms or (nms == fms and nf <= ff), nms, nf, limit, nms + 1, false
  elseif alg == 'c' then
    return sc + cost <= limit, 0, sc + cost, 0, now + w, extra
  elseif alg == 'w' then
    -- A sliding window, as algorithms.DecideRing decides it. Returns, in
    -- place of c and p, the ring charging would write and what the key
    -- used before the request; and, for a rejection, the retry instant.
    local n = tonumber(extra)
    local idx = floordiv(now * n, w)
    local r
    r, idx = ringOf(j, n, idx)
    local used = 0
    for i = 1, n + 1 do
      used = used + r[i]
    end
    local reset = substart(idx + 1 + n, w, n)
    if used + cost <= limit then
      r[idx % (n + 1) + 1] = r[idx % (n + 1) + 1] + cost
      return true, idx, r, used, reset, false
    end
    local retry = reset
    if cost <= limit then
      -- When sub-window k starts, sub-window k-n-1 leaves.
      local left = used
      for k = idx + 1, idx + n + 1 do
        left = left - r[k % (n + 1) + 1]
        if left + cost <= limit then
          retry = substart(k, w, n)
          break
        end
      end
    end
    return false, idx, r, used, reset, false, retry
  end

  local idx = floordiv(now, w)
  local elapsed = now - idx * w

  -- Counts written more than a window ahead of the clock were kept for a
  -- shorter window (the zone's window grew in a reload): they start
  -- afresh. Counts written in the next window (the clock stepped back):
  -- decide as of the start of their window rather than forget them.
  if sw and sw > idx + 1 then
    sw = nil
  elseif sw and sw > idx then
    idx = sw
    elapsed = 0
  end

  -- Roll the stored counts forward to window idx.
  local cur, prev = 0, 0
  if sw == idx then
    cur, prev = sc, sp
  elseif sw == idx - 1 then
    prev = sc
  end

  local ok
  local room = limit - cost - cur
  if room < 0 then
    ok = false
  elseif alg == 's' and prev > 0 then
    -- floor(prev*(w-elapsed)/w) <= room  <=>  prev*(w-elapsed) < (room+1)*w.
    -- A product computed below 2^53 is exact; only larger ones need limbs.
    local x, y = prev * (w - elapsed), (room + 1) * w
    if x < EXACT and y < EXACT then
      ok = x < y
    else
      ok = less(mul(prev, w - elapsed), mul(room + 1, w))
    end
  else
    ok = true
  end

  -- The counters matter until the next window ends: a sliding tail
  -- weighs them as its previous window, and for either algorithm the
  -- first charge in the next window reports what they came to (the
  -- period usage metric). Both stores keep them that long.
  return ok, idx, cur + cost, prev, now + (w - elapsed + w), false
end

-- lease charges up to ask more units to the zone whose counters are at
-- s[j], as the request just charged left them, if it has room for them
-- beyond 2N times as many, and returns how many it charged.
local function lease(j, alg, limit, w, extra, ask)
  local room
  if alg == 'g' then
    local burst = tonumber(extra)
    if burst == 0 then
      burst = limit
    end
    -- Room: (now + burst*T - TAT) / T, in whole units.
    local bq, br = muldiv(burst, w, limit)
    local rms, rf = now + bq - s[j + 1], br - s[j + 2]
    if rf < 0 then
      rms, rf = rms - 1, rf + limit
    end
    if rms < 0 then
      return 0
    end
    local q, r = muldiv(rms, limit, w)
    room = q + math.floor((r + rf) / w)
  elseif alg == 'w' then
    room = limit
    for _, c in ipairs(rings[j]) do
      room = room - c
    end
  else
    local idx = s[j + 1]
    local elapsed = math.max(now - idx * w, 0)
    local used = s[j + 2]
    if alg == 's' and s[j + 3] > 0 then
      used = used + muldiv(s[j + 3], w - elapsed, w)
    end
    room = limit - used
  end
  local grant = math.min(ask, math.floor(room / (2 * instances)))
  if grant <= 0 then
    return 0
  end
  if alg == 'g' then
    local cq, cr = muldiv(grant, w, limit)
    local nms, nf = s[j + 1] + cq, s[j + 2] + cr
    if nf >= limit then
      nms, nf = nms + 1, nf - limit
    end
    s[j + 1], s[j + 2] = nms, nf
    if nms + 1 > s[j + 4] then
      s[j + 4], s[j + 5] = nms + 1, 2
    end
  elseif alg == 'w' then
    local r = rings[j]
    local at = s[j + 1] % #r + 1
    r[at] = r[at] + grant
  else
    s[j + 2] = s[j + 2] + grant
  end
  return grant
end

-- inflight returns the costs in flight kept at s[j] that still count at
-- now, for a window of w ms: those taken in this window or the one before
-- (algorithms/inflight.go).
local function inflight(j, w)
  local iw, idx = s[j + 9], floordiv(now, w)
  if iw < idx - 1 then
    return 0
  elseif iw == idx - 1 then
    return s[j + 10]
  end
  return s[j + 10] + s[j + 11]
end

-- settledAllows reports whether the zone whose nine slots start at zs[z9
-- + 1] would allow its request on the key's settled count: the counters
-- at s[j], as the requests so far left them, less the costs in flight, as
-- algorithms.Settled and SettledRing take them off: windowed costs off
-- the windows they were taken in, a ring's off its newest sub-windows, a
-- TAT moved back by their span.
local function settledAllows(z9)
  local j, alg, limit, w, cost, extra = zs[z9 + 1], zs[z9 + 2], zs[z9 + 3], zs[z9 + 4], zs[z9 + 5], zs[z9 + 6]
  local sw, sc, sp, ring = s[j + 1], s[j + 2], s[j + 3], rings[j]
  if alg == 'g' then
    local units = inflight(j, w)
    if units > 0 and ((sw or 0) ~= 0 or sc ~= 0 or sp ~= 0) then
      -- The TAT's fraction in 1/limit ms, as decide reads it.
      local ms, f = tatOf(sw, sc, sp, limit)
      local q, r = muldiv(units, w, limit)
      ms, f = ms - q, f - r
      if f < 0 then
        ms, f = ms - 1, f + limit
      end
      s[j + 1], s[j + 2], s[j + 3] = ms, f, limit
    end
  elseif alg == 'w' then
    local units = inflight(j, w)
    if units > 0 and #ring > 0 then
      local r = {}
      for i, c in ipairs(ring) do
        r[i] = c
      end
      local k = sw
      while units > 0 and k > sw - #r do
        local at = k % #r + 1
        local off = math.min(r[at], units)
        r[at], units = r[at] - off, units - off
        k = k - 1
      end
      rings[j] = r
    end
  elseif sw and s[j + 9] <= sw then
    -- In the counts' windows: those taken in window sw come off c, those
    -- of window sw-1 off p.
    local pc, pp = 0, 0
    if s[j + 9] == sw then
      pc, pp = s[j + 10], s[j + 11]
    elseif s[j + 9] == sw - 1 then
      pp = s[j + 10]
    end
    s[j + 2], s[j + 3] = math.max(sc - pc, 0), math.max(sp - pp, 0)
  end
  local ok = decide(j, alg, limit, w, cost, extra)
  s[j + 1], s[j + 2], s[j + 3], rings[j] = sw, sc, sp, ring
  return ok
end

-- takeInflight adds cost, taken in window win, to the costs in flight at
-- s[j], as algorithms.TakeInFlight does.
local function takeInflight(j, win, cost)
  local iw = s[j + 9]
  if iw < win then
    local prev = 0
    if iw == win - 1 then
      prev = s[j + 10]
    end
    s[j + 9], s[j + 10], s[j + 11] = win, cost, prev
  elseif iw == win then
    s[j + 10] = s[j + 10] + cost
  elseif iw == win + 1 then
    s[j + 11] = s[j + 11] + cost
  end
  flying[j] = true
end

local k, a = 0, 3
while a <= #ARGV do
  local charge = ARGV[a] == '1'
  local n = tonumber(ARGV[a + 1])
  local m = tonumber(ARGV[a + 2])
  a = a + 3
  -- out[first] will be how many of the entry's m requests were allowed.
  local first = o + 1
  o = first
  for z = 0, n - 1 do
    k = k + 1
    local key = KEYS[k]
    local j = at[key]
    local alg = ARGV[a]
    local holders = false
    if alg == 'c' then
      k = k + 1
      holders = KEYS[k]
    end
    if not j then
      j = ns + 1
      ns = ns + 12
      at[key] = j
      local v = redis.call('HMGET', key, 'w', 'c', 'p', 't', 'o', 'ox', 'b', 'iw', 'ic', 'ip')
      local over = tonumber(v[5]) or false
      local ox = tonumber(v[6]) or 0
      if over and ox ~= 0 and ox <= now then
        -- An override that has ended: forget it, and let the counters
        -- expire as they would without it.
        redis.call('HDEL', key, 'o', 'ox')
        over = false
        v[4] = 0
      end
      s[j], s[j + 1], s[j + 2], s[j + 3], s[j + 4], s[j + 5], s[j + 6], s[j + 7], s[j + 8] =
        key, tonumber(v[1]) or false, tonumber(v[2]) or 0, tonumber(v[3]) or 0, tonumber(v[4]) or 0, 0, over, false,
        tonumber(v[7]) or 0
      s[j + 9], s[j + 10], s[j + 11] = tonumber(v[8]) or 0, tonumber(v[9]) or 0, tonumber(v[10]) or 0
      if alg == 'w' then
        local r = {}
        for c in string.gmatch(redis.call('HGET', key, 'r') or '', '%d+') do
          r[#r + 1] = tonumber(c)
        end
        rings[j] = r
      end
      if alg == 'c' then
        s[j + 7] = holders
        local ended = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
        if #ended > 0 then
          local gone = 0
          for _, mem in ipairs(ended) do
            gone = gone + (tonumber(string.match(mem, '/(%d+)$')) or 0)
          end
          redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
          -- Written back with at least a lease to live, so that a hash
          -- the reaping recreates does not outlive its holders.
          local lease = tonumber(ARGV[a + 2])
          s[j + 1], s[j + 2] = s[j + 1] or 0, math.max(s[j + 2] - gone, 0)
          if s[j + 4] < now + lease then
            s[j + 4], s[j + 5] = now + lease, 2
          else
            s[j + 5] = 1
          end
        end
      end
    end
    local z9 = 9 * z
    local limit = s[j + 6] or tonumber(ARGV[a + 1])
    zs[z9 + 1], zs[z9 + 2], zs[z9 + 3], zs[z9 + 4], zs[z9 + 5], zs[z9 + 6], zs[z9 + 7], zs[z9 + 8], zs[z9 + 9] =
      j, alg, limit, tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), ARGV[a + 4], tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]),
      ARGV[a + 7] == '1'
    -- The zone's counters and ban as stored before the entry, its limit,
    -- no lease yet, and no refusal for costs in flight; the verdict (o +
    -- 4), the lease (o + 6) and that refusal (o + 8) are set below.
    out[o + 1], out[o + 2], out[o + 3], out[o + 5], out[o + 6], out[o + 7], out[o + 8] =
      s[j + 1] or 0, s[j + 2], s[j + 3], limit, 0, s[j + 8], 0
    o = o + 8
    a = a + 8
  end

  -- The entry's requests, one after the other. Each sees the charges of
  -- the ones before it; once one is rejected, the rest would be decided
  -- against the same counters, and are rejected too.
  local allowed = 0
  for i = 1, m do
    local all = true
    for z = 0, n - 1 do
      local z6, z9 = 6 * z, 9 * z
      local j = zs[z9 + 1]
      local ok, pw, pc, pp, pt, holder, retry = decide(j, zs[z9 + 2], zs[z9 + 3], zs[z9 + 4], zs[z9 + 5], zs[z9 + 6])
      if zs[z9 + 2] == 'w' then
        -- A sliding window answers the sub-window, what the key used
        -- before the entry and the first rejection's retry instant.
        if i == 1 then
          out[first + 8 * z + 1], out[first + 8 * z + 2], out[first + 8 * z + 3] = pw, pp, 0
        end
        if not ok then
          out[first + 8 * z + 3] = retry
        end
      end
      if zs[z9 + 8] > 0 and s[j + 8] > now then
        ok = false -- banned
      end
      out[first + 8 * z + 4] = ok and 1 or 0
      all = all and ok
      pend[z6 + 1], pend[z6 + 2], pend[z6 + 3], pend[z6 + 4], pend[z6 + 5], pend[z6 + 6] = j, pw, pc, pp, pt, holder
    end
    if not all then
      break
    end
    if not charge then
      -- Nothing changes: every one of them is allowed.
      allowed = m
      break
    end
    allowed = allowed + 1
    for z = 0, n - 1 do
      local z6, z9 = 6 * z, 9 * z
      local j = pend[z6 + 1]
      if rings[j] then
        s[j + 1], rings[j] = pend[z6 + 2], pend[z6 + 3]
      else
        s[j + 1], s[j + 2], s[j + 3] = pend[z6 + 2], pend[z6 + 3], pend[z6 + 4]
      end
      if pend[z6 + 5] > s[j + 4] then
        s[j + 4], s[j + 5] = pend[z6 + 5], 2
      elseif s[j + 5] == 0 then
        s[j + 5] = 1
      end
      if pend[z6 + 6] then
        redis.call('ZADD', s[j + 7], pend[z6 + 5], pend[z6 + 6])
      end
      if zs[z9 + 9] then
        -- The window (of the zone's window) the cost was taken in: a
        -- sliding window's holds its sub-window; a gcra cost's is now's.
        local win, alg = pend[z6 + 2], zs[z9 + 2]
        if alg == 'w' then
          win = floordiv(win, tonumber(zs[z9 + 6]))
        elseif alg == 'g' then
          win = floordiv(now, zs[z9 + 4])
        end
        takeInflight(j, win, zs[z9 + 5])
      end
    end
  end
  out[first] = allowed
  if allowed < m then
    -- A request was rejected: each zone with a ban that rejected it bans
    -- its key, unless the key is banned already, or the zone keeps its
    -- costs in flight and the settled count alone has room for it.
    for z = 0, n - 1 do
      local z9 = 9 * z
      local j, ban = zs[z9 + 1], zs[z9 + 8]
      if ban > 0 and out[first + 8 * z + 4] == 0 and s[j + 8] <= now then
        if zs[z9 + 9] and settledAllows(z9) then
          out[first + 8 * z + 8] = 1
        else
          s[j + 8] = now + ban
          banned[j] = true
          if s[j + 8] > s[j + 4] then
            s[j + 4], s[j + 5] = s[j + 8], 2
          elseif s[j + 5] == 0 then
            s[j + 5] = 1
          end
        end
      end
    end
  end
  if charge and m == 1 and allowed == 1 then
    for z = 0, n - 1 do
      local z9 = 9 * z
      if zs[z9 + 7] > 0 then
        local j = zs[z9 + 1]
        local grant = lease(j, zs[z9 + 2], zs[z9 + 3], zs[z9 + 4], zs[z9 + 6], zs[z9 + 7])
        if grant > 0 then
          out[first + 8 * z + 6] = grant
          if s[j + 5] == 0 then
            s[j + 5] = 1
          end
        end
      end
    end
  end
end

for j = 1, ns, 12 do
  local write = s[j + 5]
  -- A key first seen by a rejection that banned it has no window yet.
  local w = s[j + 1] or 0
  if banned[j] then
    redis.call('HSET', s[j], 'b', s[j + 8])
  end
  if flying[j] then
    redis.call('HSET', s[j], 'iw', s[j + 9], 'ic', s[j + 10], 'ip', s[j + 11])
  end
  if rings[j] and write ~= 0 then
    redis.call('HSET', s[j], 'r', table.concat(rings[j], ','))
  end
  if write == 2 and not s[j + 6] then
    redis.call('HSET', s[j], 'w', w, 'c', s[j + 2], 'p', s[j + 3], 't', s[j + 4])
    redis.call('PEXPIRE', s[j], s[j + 4] - now)
    if s[j + 7] then
      redis.call('PEXPIRE', s[j + 7], s[j + 4] - now)
    end
  elseif write ~= 0 then
    redis.call('HSET', s[j], 'w', w, 'c', s[j + 2], 'p', s[j + 3])
    if banned[j] and s[j + 6] then
      -- Under an override the admin call sets the expiry; a ban that
      -- ends later moves it, and t with it, so that removing the
      -- override keeps the ban.
      redis.call('HSET', s[j], 't', s[j + 4])
      local ttl = redis.call('PTTL', s[j])
      if ttl >= 0 and now + ttl < s[j + 8] then
        redis.call('PEXPIRE', s[j], s[j + 8] - now)
      end
    end
  end
end
return out
