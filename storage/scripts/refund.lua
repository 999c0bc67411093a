-- refund.lua takes back a charge made by take.lua: a request charged in
-- some cluster slots and then rejected in another, or a concurrency
-- request that is done and releases its units. It runs atomically in one
-- slot, like the charge it undoes.
--
-- KEYS[i]  counters of the i-th zone and key (see take.lua).
-- ARGV     five per key: the algorithm ("f", "s", "w", "g", "c"), two numbers
--          a and b, the holder (concurrency) and the limit (gcra). For the
--          windowed algorithms a is the window index the cost was charged
--          in (a sliding window's: the sub-window's) and b the cost; for gcra, cost*window/limit as a whole ms and
--          a fraction in 1/limit ms (computed exactly by the caller); for
--          concurrency b is the cost.
--
-- Windowed: a charge still in the current window comes off c; one that
-- has since become the previous window comes off p; an older one no
-- longer counts; a sliding window's comes off its sub-window while that
-- is still in the ring. GCRA: the TAT moves back by cost*window/limit (a TAT
-- moved from the past to now plus that is then now: the same bucket).
-- Concurrency: the holder leaves the set and its cost comes off c, only
-- if it was still there: a holder whose lease ended was taken off then.
-- Counts never go below zero, and the key keeps its expiry.

for i = 1, #KEYS do
  local b = 5 * (i - 1)
  local alg, x, y = ARGV[b + 1], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local key = KEYS[i]
  if alg == 'w' then
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
    -- The holder set is named as take.lua names it.
    if redis.call('ZREM', (string.gsub(key, '}:', '}h:', 1)), ARGV[b + 4]) == 1 then
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
      elseif w == x then
        redis.call('HSET', key, 'c', math.max((tonumber(v[2]) or 0) - y, 0))
      elseif w == x + 1 then
        redis.call('HSET', key, 'p', math.max((tonumber(v[3]) or 0) - y, 0))
      end
    end
  end
end
return 1
