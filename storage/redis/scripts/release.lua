-- release.lua releases what take.lua took: for a request taken in some
-- cluster slots and then rejected in another, a concurrency request that
-- is done with its units, or a request whose response a count_status
-- zone does not count. And it ends a request's cost in flight, for a
-- zone that keeps them, whether the cost is released or stays. It runs
-- atomically in one slot, like the take it undoes.
--
-- KEYS     the counters of each zone and key (see take.lua), a
--          concurrency zone's followed by its holders' set.
-- ARGV     seven per zone: the algorithm ("f", "s", "w", "g", "c"; "k" for
--          a cost that stays: only its time in flight ends), two numbers
--          a and b, the holder (concurrency), the limit (gcra), and the
--          window (of the zone's window) the cost was taken in and the
--          cost, for a zone that keeps its costs in flight ("" and 0 for
--          others). For the windowed algorithms a is the window index the
--          cost was taken in (a sliding window's: the sub-window's) and
--          b the cost; for gcra, cost*window/limit as a whole ms and a
--          fraction in 1/limit ms (computed exactly by the caller); for
--          concurrency b is the cost.
--
-- Windowed: a take still in the current window comes off c; one that
-- has since become the previous window comes off p; an older one no
-- longer counts; a sliding window's comes off its sub-window while that
-- is still in the ring. GCRA: the TAT moves back by cost*window/limit (a TAT
-- moved from the past to now plus that is then now: the same bucket).
-- Concurrency: the holder leaves the set and its cost comes off c, only
-- if it was still there: a holder whose hold ended was taken off then.
-- In flight (iw, ic, ip; see take_bans.lua): the cost comes off the window it
-- was taken in, ic if that is iw, ip if it is iw-1, as
-- algorithms.EndInFlight takes it. Counts never go below zero, a hash
-- that is gone is not made again, and the key keeps its expiry.

-- takeOff takes cost off a window's pair of fields of key: off cur if the
-- window it was counted in (at) is the one the hash holds (w), off prev if
-- that has since become the previous one; v holds the two fields' values.
local function takeOff(key, w, at, cur, prev, v, cost)
  if w == at then
    redis.call('HSET', key, cur, math.max((tonumber(v[1]) or 0) - cost, 0))
  elseif w == at + 1 then
    redis.call('HSET', key, prev, math.max((tonumber(v[2]) or 0) - cost, 0))
  end
end

local k = 0
for b = 0, #ARGV - 1, 7 do
  local alg, x, y = ARGV[b + 1], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  k = k + 1
  local key = KEYS[k]
  if ARGV[b + 6] ~= '' then
    local v = redis.call('HMGET', key, 'iw', 'ic', 'ip')
    takeOff(key, tonumber(v[1]), tonumber(ARGV[b + 6]), 'ic', 'ip', {v[2], v[3]}, tonumber(ARGV[b + 7]))
  end
  if alg == 'k' then
    -- The cost stays counted.
  elseif alg == 'w' then
    local v = redis.call('HMGET', key, 'w', 'r')
    if v[1] and v[2] then
      local r = {}
      for c in string.gmatch(v[2], '%d+') do
        r[#r + 1] = tonumber(c)
      end
      local w = tonumber(v[1])
      if x <= w and w - x < #r then
        local at = x % #r + 1
        r[at] = math.max(r[at] - y, 0)
        redis.call('HSET', key, 'r', table.concat(r, ','))
      end
    end
  elseif alg == 'c' then
    k = k + 1
    if redis.call('ZREM', KEYS[k], ARGV[b + 4]) == 1 then
      -- A hash gone (reset through the admin API) is not made again,
      -- which would leave it without an expiry.
      local c = tonumber(redis.call('HGET', key, 'c'))
      if c then
        redis.call('HSET', key, 'c', math.max(c - y, 0))
      end
    end
  else
    local v = redis.call('HMGET', key, 'w', 'c', 'p')
    if v[1] then
      local w = tonumber(v[1])
      if alg == 'g' then
        -- The TAT's fraction is in 1/p ms; take.lua wrote p = limit.
        local limit = tonumber(ARGV[b + 5])
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
