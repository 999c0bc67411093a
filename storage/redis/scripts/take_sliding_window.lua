-- take_sliding_window.lua: the sliding window of n buckets (ALGS.w), as
-- algorithms.DecideRing (algorithms/sliding.go) decides it. Reads and
-- writes the key state s at W and the ring rings[j]; answers OUT_W,
-- OUT_C and OUT_P in its own way (below).
--
-- A sliding window keeps the index of its current sub-window in w and the
-- counts of that sub-window and the n before it in r, "c0,c1,...,cn",
-- sub-window k's at position k mod (n+1); rings[j] holds them as a table,
-- position k mod (n+1) at index k mod (n+1) + 1. For its zones the
-- answer's w, c and p are not the stored counts but what the caller needs
-- to rebuild each request's decision: the sub-window decided in, what the
-- key used before the entry, and the retry instant of the entry's first
-- request rejected (0 if none was).

-- substart returns when sub-window k of a window of w ms cut in n starts:
-- ceil(k*w/n). k*w stays below 2^53 (k is about now*n/w).
local function substart(k, w, n)
  return -floordiv(-k * w, n)
end

-- ringOf returns the ring at s[j] rolled forward to sub-window idx for n
-- buckets (rollRing), and idx.
local function ringOf(j, n, idx)
  return rollRing(rings[j], s[j + W] or 0, n, idx)
end

ALGS.w = {
  load = function(j)
    local r = {}
    for c in string.gmatch(redis.call('HGET', s[j + KEY], 'r') or '', '%d+') do
      r[#r + 1] = tonumber(c)
    end
    rings[j] = r
  end,

  -- The decision holds the ring taking writes, what the key used before
  -- the request, and for a rejection the retry instant.
  decide = function(j, zone)
    local w, limit, cost = zone.window, zone.limit, zone.cost
    local n = tonumber(zone.extra)
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
      return {allowed = true, w = idx, ring = r, used = used, expires = reset}
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
    return {allowed = false, w = idx, ring = r, used = used, expires = reset, retry = retry}
  end,

  -- The answer in place of w, c and p: the sub-window and what the key
  -- used, as the entry's first request found them, and the retry instant
  -- of its first request rejected.
  answer = function(zone, d, first)
    local b = zone.base
    if first then
      out[b + OUT_W], out[b + OUT_C], out[b + OUT_P] = d.w, d.used, 0
    end
    if not d.allowed then
      out[b + OUT_P] = d.retry
    end
  end,

  room = function(j, zone)
    local room = zone.limit
    for _, c in ipairs(rings[j]) do
      room = room - c
    end
    return room
  end,

  lease = function(j, zone, units)
    local r = rings[j]
    local pos = s[j + W] % #r + 1
    r[pos] = r[pos] + units
  end,

  -- Costs in flight come off the newest sub-windows (algorithms.SettledRing).
  settle = function(j, zone)
    local units, ring = inflight(j, zone.window), rings[j]
    if units > 0 and #ring > 0 then
      local r = {}
      for i, c in ipairs(ring) do
        r[i] = c
      end
      local k = s[j + W]
      while units > 0 and k > s[j + W] - #r do
        local pos = k % #r + 1
        local off = math.min(r[pos], units)
        r[pos], units = r[pos] - off, units - off
        k = k - 1
      end
      rings[j] = r
    end
  end,

  -- The sub-window's window.
  window = function(zone, d)
    return floordiv(d.w, tonumber(zone.extra))
  end,
}
