-- take_concurrency.lua: concurrency (ALGS.c), as algorithms/concurrency.go
-- decides it. Reads and writes the key state s at C, the units held, and
-- T/WRITE; writes w and p as 0. Reads and writes the holders' set at
-- s[j + HOLDERS].
--
-- Concurrency keeps each holder in a sorted set beside the hash, scored
-- by when its hold (the zone's window) ends; a holder is named
-- "<instance>:<request>/<cost>". The set comes in KEYS right after the
-- hash, as every key a script touches must (Redis Cluster routes the call
-- by them, and replicates its effects on them): the caller names it
-- prefix{tag}h{key}:zone, which no counter hash can be named, in the hash's
-- slot by the same tag. Holders whose hold ended (their instance died
-- without releasing) are removed, and their cost taken off c, before the
-- key is decided.

ALGS.c = {
  -- Reaps the holders whose hold ended, from holders, the key's set, for
  -- a hold of w ms.
  load = function(j, holders, w)
    s[j + HOLDERS] = holders
    local ended = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
    if #ended > 0 then
      local gone = 0
      for _, mem in ipairs(ended) do
        gone = gone + (tonumber(string.match(mem, '/(%d+)$')) or 0)
      end
      redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
      -- Written back with at least a hold to live, so that a hash the
      -- reaping recreates does not outlive its holders.
      s[j + W], s[j + C] = s[j + W] or 0, math.max(s[j + C] - gone, 0)
      if s[j + T] < now + w then
        s[j + T], s[j + WRITE] = now + w, WRITE_EXPIRY
      else
        s[j + WRITE] = WRITE_COUNTS
      end
    end
  end,

  -- Taking adds the request as a holder until its hold ends.
  decide = function(j, zone)
    local c = s[j + C] + zone.cost
    return {allowed = c <= zone.limit, w = 0, c = c, p = 0, expires = now + zone.window, holder = zone.extra}
  end,

  -- The units held count as a fixed window's count does, for a lease and
  -- for costs in flight.
  room = ALGS.f.room,
  lease = ALGS.f.lease,
  settle = ALGS.f.settle,
  window = ALGS.f.window,
}
