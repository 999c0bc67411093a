-- finish.lua ends the accounting of what take.lua took: it releases a
-- request taken in some cluster slots and then rejected in another, a concurrency request
-- that is done with its units, a request whose response a count_status
-- zone does not count, and what a true-up does not keep of a reservation;
-- and it takes a true-up's debt past the limit (storage.Request.Finishing).
-- And it ends a request's cost in flight, for a zone that keeps them,
-- whatever stays. It runs atomically in one slot, like the take it
-- finishes.
--
-- The finish script is arith.lua (exact integer arithmetic),
-- period.lua (which window of a zone holds an instant), ring.lua
-- (the roll of a sliding window's ring), tat.lua (a gcra key's TAT) and
-- this file after them, joined by the store (finishOrder) into one
-- script.
--
-- KEYS     the counters of each zone and key (see take.lua), a
--          concurrency zone's followed by its holders' set.
-- ARGV     FINISH_ARGS per zone, at the offsets ARG_* below.
--
-- Released, windowed: a take still in the current window comes off c;
-- one that has since become the previous window comes off p; an older
-- one no longer counts; a sliding window's comes off its sub-window while
-- that is still in the ring. GCRA: the TAT moves back by cost*window/limit
-- (a TAT moved from the past to now plus that is then now: the same
-- bucket). Concurrency: the holder leaves the set and its cost comes off
-- c, only if it was still there: a holder whose hold ended was taken off
-- then. Counts never go below zero, a hash that is gone is not made
-- again, and the key keeps its expiry.
--
-- A debt (algorithms/debt.go) lands in the window of now, the true-up's:
-- windowed, the counts roll to now's window and the units add to c, up
-- to twice the limit; a sliding window's add to now's sub-window, up to
-- twice the limit in the ring; gcra's move the TAT, from now if it has
-- passed, on by units*window/limit, to at most now plus two bucket
-- depths. Nothing goes lower than it was. A hash that is gone (its
-- counts no longer mattered) is made again with the debt, and the key's
-- expiry moves to when the debt stops mattering if that is later.
--
-- In flight (iw, ic, ip; see take_bans.lua): the cost comes off the
-- window it was taken in, ic if that is iw, ip if it is iw-1, as
-- algorithms.EndInFlight takes it.
--
-- A wide zone's counts ("F", "S", and "K" for its cost that stays whole;
-- see take_wide.lua) run to 2^63 - 1: its units, limit and costs in
-- flight stay the strings they came as, and its fields the strings Redis
-- holds, counted exactly in limbs (arith.lua's plus and minus).

-- A zone's arguments, at ARGV[a + ARG_*] from its first argument ARGV[a]:
-- the algorithm ("f", "s", "w", "g", "c", "F", "S"; "k", or "K" in a
-- wide zone, for a cost that stays whole: only its time in flight ends);
-- where the cost was taken, and the units released (0 for none): for
-- the windowed algorithms the window index (a sliding window's: the
-- sub-window's) and the units, for gcra
-- units*window/limit as a whole ms and a fraction in 1/limit ms (computed
-- exactly by the caller), for concurrency the units alone; the holder
-- (concurrency); the limit the cost was decided against (gcra, and a
-- debt); the window (of the zone's window) the cost was taken in and the
-- cost, for a zone that keeps its costs in flight ("" and 0 for others);
-- the units to take past the limit (0 for none); the zone's window (ms;
-- for a calendar period, the periods around the caller's clock, as
-- take.lua's ARG_WINDOW: period.lua); gcra's burst or a sliding
-- window's buckets ("" for others); and "" to
-- use the server clock (TIME), or a time in ms since the epoch (tests
-- drive the shared vectors with it). The store's Go code mirrors these
-- offsets (rel*).
local ARG_ALG, ARG_AT, ARG_UNITS, ARG_HOLDER, ARG_LIMIT, ARG_IW, ARG_IC, ARG_DEBT, ARG_WINDOW, ARG_EXTRA, ARG_NOW = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
local FINISH_ARGS = 11

-- clockOf returns the time a zone's ARG_NOW names, in ms: the server's
-- clock, read once a call, if it is "".
local serverNow
local function clockOf(arg)
  if arg ~= '' then
    return tonumber(arg)
  end
  if not serverNow then
    local t = redis.call('TIME')
    serverNow = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return serverNow
end

-- WIDE names the algorithms of wide zones.
local WIDE = {F = true, S = true, K = true}

-- countOf reads a count field's value v as the zone's counts are kept: a
-- number, or a wide zone's decimal string.
local function countOf(v, wide)
  if wide then
    return v or '0'
  end
  return tonumber(v) or 0
end

-- takeOff takes cost off a window's pair of fields of key: off cur if the
-- window it was counted in (at) is the one the hash holds (w), off prev if
-- that has since become the previous one; v holds the two fields' values.
-- A wide zone's cost is a string.
local function takeOff(key, w, at, cur, prev, v, cost)
  local wide = type(cost) == 'string'
  if w == at then
    redis.call('HSET', key, cur, minus(countOf(v[1], wide), cost))
  elseif w == at + 1 then
    redis.call('HSET', key, prev, minus(countOf(v[2], wide), cost))
  end
end

-- parseRing reads a sliding window's r field into a table.
local function parseRing(field)
  local r = {}
  for c in string.gmatch(field or '', '%d+') do
    r[#r + 1] = tonumber(c)
  end
  return r
end

-- keepUntil moves key's expiry, and its t, to expires (ms) if that is
-- later: as take_write_back.lua does, under an override in force only if
-- the key would expire before it.
local function keepUntil(key, expires, now)
  local t, o, ox = unpack(redis.call('HMGET', key, 't', 'o', 'ox'))
  if (tonumber(t) or 0) >= expires then
    return
  end
  redis.call('HSET', key, 't', expires)
  ox = tonumber(ox) or 0
  local ttl = redis.call('PTTL', key)
  if not o or ox ~= 0 and ox <= now or ttl >= 0 and now + ttl < expires then
    redis.call('PEXPIRE', key, expires - now)
  end
end

-- debt takes units past the limit at now in key's counts, for the
-- algorithm alg, the limit, the zone's windows period (period.lua;
-- for gcra and a sliding window, the window's length w in ms) and extra:
-- gcra's burst, a sliding window's buckets. A wide zone's units and limit
-- are strings.
local function debt(key, alg, units, limit, period, extra, now)
  local w = period
  local expires
  if alg == 'g' then
    local sw, sc, sp = unpack(redis.call('HMGET', key, 'w', 'c', 'p'))
    -- The TAT in 1/limit ms, as a take reads it.
    local ms, f = tatOf(tonumber(sw), tonumber(sc) or 0, tonumber(sp) or 0, limit)
    if ms < now then
      ms, f = now, 0
    end
    local q, r = muldiv(units, w, limit)
    local nms, nf = ms + q, f + r
    if nf >= limit then
      nms, nf = nms + 1, nf - limit
    end
    local bq, br = muldiv(2 * tonumber(extra), w, limit) -- two bucket depths
    if nms < now + bq or nms == now + bq and nf < br then
      ms, f = nms, nf
    elseif ms < now + bq or ms == now + bq and f < br then
      ms, f = now + bq, br
    end
    redis.call('HSET', key, 'w', ms, 'c', f, 'p', limit)
    expires = ms + 1
  elseif alg == 'w' then
    local n = tonumber(extra)
    local sw, field = unpack(redis.call('HMGET', key, 'w', 'r'))
    local old = parseRing(field)
    sw = tonumber(sw) or 0
    local idx = floordiv(now * n, w)
    local r
    r, idx = rollRing(old, sw, n, idx)
    local used = 0
    for i = 1, n + 1 do
      used = used + r[i]
    end
    local pos = idx % (n + 1) + 1
    r[pos] = r[pos] + math.min(units, math.max(2 * limit - used, 0))
    redis.call('HSET', key, 'w', idx, 'r', table.concat(r, ','))
    expires = -floordiv(-(idx + 1 + n) * w, n) -- when the ring's last sub-window leaves
  else
    local sw, sc, sp = unpack(redis.call('HMGET', key, 'w', 'c', 'p'))
    sw = tonumber(sw)
    local idx, _, _, after = periodAt(period, now)
    -- Rolled as take_fixed_window.lua's windowAt rolls them.
    if sw and sw > idx + 1 then
      sw = nil
    elseif sw and sw > idx then
      idx = sw
      _, _, after = periodOf(period, idx)
    end
    local wide = WIDE[alg]
    local cur, prev = countOf(nil, wide), countOf(nil, wide)
    if sw == idx then
      cur, prev = countOf(sc, wide), countOf(sp, wide)
    elseif sw == idx - 1 then
      prev = countOf(sc, wide)
    end
    if wide then
      cur = wideAdd(cur, wideMin(units, wideSub(wideAdd(limit, limit), cur)))
    else
      cur = cur + math.min(units, math.max(2 * limit - cur, 0))
    end
    redis.call('HSET', key, 'w', idx, 'c', cur, 'p', prev)
    expires = after -- the end of the next window, as a take's
  end
  keepUntil(key, expires, now)
end

local k = 0
for a = 1, #ARGV, FINISH_ARGS do
  local alg, x = ARGV[a + ARG_ALG], tonumber(ARGV[a + ARG_AT])
  -- A wide zone's units, costs and limit stay strings.
  local count = WIDE[alg] and tostring or tonumber
  local y = count(ARGV[a + ARG_UNITS])
  k = k + 1
  local key = KEYS[k]
  if ARGV[a + ARG_IW] ~= '' then
    local v = redis.call('HMGET', key, 'iw', 'ic', 'ip')
    takeOff(key, tonumber(v[1]), tonumber(ARGV[a + ARG_IW]), 'ic', 'ip', {v[2], v[3]}, count(ARGV[a + ARG_IC]))
  end
  local units = tonumber(ARGV[a + ARG_DEBT])
  if alg == 'k' or alg == 'K' then
    -- The cost stays counted.
  elseif alg == 'c' then
    k = k + 1
    if redis.call('ZREM', KEYS[k], ARGV[a + ARG_HOLDER]) == 1 then
      -- A hash gone (reset through the admin API) is not made again,
      -- which would leave it without an expiry.
      local c = tonumber(redis.call('HGET', key, 'c'))
      if c then
        redis.call('HSET', key, 'c', math.max(c - y, 0))
      end
    end
  elseif units > 0 then
    debt(key, alg, count(ARGV[a + ARG_DEBT]), count(ARGV[a + ARG_LIMIT]), readPeriod(ARGV[a + ARG_WINDOW]), ARGV[a + ARG_EXTRA], clockOf(ARGV[a + ARG_NOW]))
  elseif alg == 'w' then
    local v = redis.call('HMGET', key, 'w', 'r')
    if v[1] and v[2] then
      local r = parseRing(v[2])
      local w = tonumber(v[1])
      if x <= w and w - x < #r then
        local at = x % #r + 1
        r[at] = math.max(r[at] - y, 0)
        redis.call('HSET', key, 'r', table.concat(r, ','))
      end
    end
  else
    local v = redis.call('HMGET', key, 'w', 'c', 'p')
    if v[1] then
      local w = tonumber(v[1])
      if alg == 'g' then
        -- The TAT's fraction is in 1/p ms; take.lua wrote p = limit.
        local limit = tonumber(ARGV[a + ARG_LIMIT])
        if tonumber(v[3]) == limit then
          local ms, f = w - x, (tonumber(v[2]) or 0) - y
          if f < 0 then
            ms, f = ms - 1, f + limit
          end
          redis.call('HSET', key, 'w', ms, 'c', f)
        end
      else
        takeOff(key, w, x, 'c', 'p', {v[2], v[3]}, y)
      end
    end
  end
end
return 1
