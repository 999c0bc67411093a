-- take_gcra.lua: GCRA (ALGS.g), as algorithms/gcra.go decides it. Reads
-- and writes the key state s at W, C and P, where it keeps its
-- theoretical arrival time TAT: w its whole ms, c its fraction in units
-- of 1/p ms, p the limit it was written at (read by tat.lua's tatOf).
-- Instants are kept as (ms, fraction in 1/limit ms).

-- burstOf returns the zone's burst: its extra argument, or the limit if
-- that is 0.
local function burstOf(zone)
  local burst = tonumber(zone.extra)
  if burst == 0 then
    burst = zone.limit
  end
  return burst
end

ALGS.g = {
  -- A request is allowed when max(TAT, now) + cost*T <= now + burst*T,
  -- T being window/limit; taking it moves the TAT to the left side. The
  -- key matters until its TAT, when its bucket is full again.
  decide = function(j, zone)
    local limit, w, cost = zone.limit, zone.window, zone.cost
    local burst = burstOf(zone)
    local tms, tf = tatOf(s[j + W], s[j + C], s[j + P], limit)
    if tms < now then
      tms, tf = now, 0
    end
    if cost > burst then
      return {allowed = false}
    end
    local bq, br = muldiv(burst, w, limit)
    local fms, ff = now + bq, br -- now + burst*T
    local cq, cr = muldiv(cost, w, limit)
    local nms, nf = tms + cq, tf + cr
    if nf >= limit then
      nms, nf = nms + 1, nf - limit
    end
    return {allowed = nms < fms or (nms == fms and nf <= ff), w = nms, c = nf, p = limit, expires = nms + 1}
  end,

  -- Room: (now + burst*T - TAT) / T, in whole units, after the request
  -- just taken.
  room = function(j, zone)
    local limit, w = zone.limit, zone.window
    local bq, br = muldiv(burstOf(zone), w, limit)
    local rms, rf = now + bq - s[j + W], br - s[j + C]
    if rf < 0 then
      rms, rf = rms - 1, rf + limit
    end
    if rms < 0 then
      return 0
    end
    local q, r = muldiv(rms, limit, w)
    return q + math.floor((r + rf) / w)
  end,

  -- The TAT moves on by units*T.
  lease = function(j, zone, units)
    local limit = zone.limit
    local cq, cr = muldiv(units, zone.window, limit)
    local nms, nf = s[j + W] + cq, s[j + C] + cr
    if nf >= limit then
      nms, nf = nms + 1, nf - limit
    end
    s[j + W], s[j + C] = nms, nf
    if nms + 1 > s[j + T] then
      s[j + T], s[j + WRITE] = nms + 1, WRITE_EXPIRY
    end
  end,

  -- Costs in flight move the TAT back by their span (algorithms.Settled).
  settle = function(j, zone)
    local limit, w = zone.limit, zone.window
    local sw, sc, sp = s[j + W], s[j + C], s[j + P]
    local units = inflight(j, w)
    if units > 0 and ((sw or 0) ~= 0 or sc ~= 0 or sp ~= 0) then
      -- The TAT's fraction in 1/limit ms, as decide reads it.
      local ms, f = tatOf(sw, sc, sp, limit)
      local q, r = muldiv(units, w, limit)
      ms, f = ms - q, f - r
      if f < 0 then
        ms, f = ms - 1, f + limit
      end
      s[j + W], s[j + C], s[j + P] = ms, f, limit
    end
  end,

  -- A gcra cost's window is now's.
  window = function(zone, d)
    return floordiv(now, zone.window)
  end,
}
