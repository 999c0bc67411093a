-- take_fixed_window.lua: the fixed window (ALGS.f), and the window
-- arithmetic it shares with the sliding tail (take_sliding_tail.lua).
-- Reads and writes the key state s at W, C and P: w is the index of the
-- window (of the zone's period: period.lua) the counts are in, c the
-- cost counted in window w, p that counted in window w-1; IW, IC and IP
-- only to take costs in flight off them (take_bans.lua).

-- windowAt rolls the counters at s[j] forward to the window of the zone's
-- period the clock is in, and returns that window's index, the ms
-- elapsed in it, its length, when the window after it ends, and the
-- counts of that window and of the one before.
--
-- Counts written more than a window ahead of the clock were kept for a
-- shorter window (the zone's window grew in a reload): they start
-- afresh. Counts written in the next window (the clock stepped back):
-- decide as of the start of their window rather than forget them.
local function windowAt(j, zone)
  local sw = s[j + W]
  local idx, start, stop, after = periodAt(zone.period, now)
  local elapsed = now - start
  if sw and sw > idx + 1 then
    sw = nil
  elseif sw and sw > idx then
    idx = sw
    start, stop, after = periodOf(zone.period, idx)
    elapsed = 0
  end
  local cur, prev = 0, 0
  if sw == idx then
    cur, prev = s[j + C], s[j + P]
  elseif sw == idx - 1 then
    prev = s[j + C]
  end
  return idx, elapsed, stop - start, after, cur, prev
end

-- windowDecision returns the decision on the zone's cost in window idx,
-- whose counts were cur and prev, and which the window ending at after
-- follows.
--
-- The counters matter until the next window ends: a sliding tail weighs
-- them as its previous window, and for either algorithm the first take
-- in the next window reports what they came to (the period usage
-- metric). Both stores keep them that long.
local function windowDecision(allowed, zone, idx, after, cur, prev)
  return {allowed = allowed, w = idx, c = cur + zone.cost, p = prev, expires = after}
end

ALGS.f = {
  decide = function(j, zone)
    local idx, _, _, after, cur, prev = windowAt(j, zone)
    return windowDecision(zone.limit - zone.cost - cur >= 0, zone, idx, after, cur, prev)
  end,

  -- What the window has left, after the request just taken.
  room = function(j, zone)
    return zone.limit - s[j + C]
  end,

  lease = function(j, zone, units)
    s[j + C] = s[j + C] + units
  end,

  -- Costs in flight come off the windows they were taken in: those taken
  -- in window w off c, those of window w-1 off p.
  settle = function(j, zone)
    local sw, iw = s[j + W], s[j + IW]
    if sw and iw <= sw then
      local pc, pp = 0, 0
      if iw == sw then
        pc, pp = s[j + IC], s[j + IP]
      elseif iw == sw - 1 then
        pp = s[j + IC]
      end
      s[j + C], s[j + P] = minus(s[j + C], pc), minus(s[j + P], pp)
    end
  end,

  window = function(zone, d)
    return d.w
  end,
}
