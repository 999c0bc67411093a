-- take_fixed_window.lua: the fixed window (ALGS.f), and the window
-- arithmetic it shares with the sliding tail (take_sliding_tail.lua).
-- Reads and writes the key state s at W, C and P: w is the index of the
-- window (of the zone's window, aligned to the epoch) the counts are in,
-- c the cost counted in window w, p that counted in window w-1; IW, IC
-- and IP only to take costs in flight off them (take_bans.lua).

-- windowAt rolls the counters at s[j] forward to the window the clock is
-- in, for windows of w ms, and returns that window's index, the ms
-- elapsed in it, and the counts of that window and of the one before.
--
-- Counts written more than a window ahead of the clock were kept for a
-- shorter window (the zone's window grew in a reload): they start
-- afresh. Counts written in the next window (the clock stepped back):
-- decide as of the start of their window rather than forget them.
local function windowAt(j, w)
  local sw = s[j + W]
  local idx = floordiv(now, w)
  local elapsed = now - idx * w
  if sw and sw > idx + 1 then
    sw = nil
  elseif sw and sw > idx then
    idx = sw
    elapsed = 0
  end
  local cur, prev = 0, 0
  if sw == idx then
    cur, prev = s[j + C], s[j + P]
  elseif sw == idx - 1 then
    prev = s[j + C]
  end
  return idx, elapsed, cur, prev
end

-- windowDecision returns the decision on the zone's cost in window idx,
-- whose counts were cur and prev, elapsed ms into it.
--
-- The counters matter until the next window ends: a sliding tail weighs
-- them as its previous window, and for either algorithm the first take
-- in the next window reports what they came to (the period usage
-- metric). Both stores keep them that long.
local function windowDecision(allowed, zone, idx, elapsed, cur, prev)
  local w = zone.window
  return {allowed = allowed, w = idx, c = cur + zone.cost, p = prev, expires = now + (w - elapsed + w)}
end

ALGS.f = {
  decide = function(j, zone)
    local idx, elapsed, cur, prev = windowAt(j, zone.window)
    return windowDecision(zone.limit - zone.cost - cur >= 0, zone, idx, elapsed, cur, prev)
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
