-- take_sliding_tail.lua: the sliding tail (ALGS.s), a fixed window that
-- also weighs the previous window's count by the share of the current
-- window still to run, (w-elapsed)/w for a window of w ms (a calendar
-- period's own length: period.lua). Keeps the fixed window's state
-- (w, c, p at W, C, P; take_fixed_window.lua), whose functions it shares
-- but decide and room.

-- tailFits reports whether floor(prev*(w-elapsed)/w) <= room, the part
-- of the previous window's count prev still counting leaving room for
-- the request: prev*(w-elapsed) < (room+1)*w. A product computed below
-- 2^53 is exact; only larger ones need limbs.
local function tailFits(prev, elapsed, room, w)
  local x, y = prev * (w - elapsed), (room + 1) * w
  if x < EXACT and y < EXACT then
    return x < y
  end
  return less(mul(prev, w - elapsed), mul(room + 1, w))
end

ALGS.s = {
  decide = function(j, zone)
    local idx, elapsed, w, after, cur, prev = windowAt(j, zone)
    local room = zone.limit - zone.cost - cur
    local ok
    if room < 0 then
      ok = false
    elseif prev > 0 then
      ok = tailFits(prev, elapsed, room, w)
    else
      ok = true
    end
    return windowDecision(ok, zone, idx, after, cur, prev)
  end,

  -- What the window has left, after the request just taken, the
  -- previous window weighed as decide weighs it.
  room = function(j, zone)
    local start, stop = periodOf(zone.period, s[j + W])
    local w = stop - start
    local elapsed = math.max(now - start, 0)
    local used = s[j + C]
    if s[j + P] > 0 then
      used = used + muldiv(s[j + P], w - elapsed, w)
    end
    return zone.limit - used
  end,

  lease = ALGS.f.lease,
  settle = ALGS.f.settle,
  window = ALGS.f.window,
}
