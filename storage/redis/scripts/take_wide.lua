-- take_wide.lua: the fixed window and the sliding tail of a wide zone
-- (ALGS.F and ALGS.S; storage.Request.Wide: a zone priced in money),
-- whose counts, limit and cost run up to 2^63 - 1. They decide as ALGS.f
-- and ALGS.s do, on the same windows (windowAt, windowDecision: of a
-- length or calendar periods, period.lua), but keep the key state's
-- C, P, IC and IP, the override and the zone's limit and cost as decimal
-- strings, counted exactly in limbs (arith.lua).
-- Wide keys take no lease: a wide zone's requests are reservations, kept
-- in flight, which are always taken in Redis.

-- loadWide keeps the fields the call read for key j as the strings Redis
-- holds: c, p, the override o (if one is in force) and the costs in
-- flight ic and ip.
local function loadWide(j, holders, w, c, p, o, ic, ip)
  s[j + C], s[j + P], s[j + IC], s[j + IP] = c or '0', p or '0', ic or '0', ip or '0'
  if s[j + OVER] then
    s[j + OVER] = o
  end
end

-- wideDecision is windowDecision's, with the count the request leaves
-- added exactly (windowDecision adds in doubles).
local function wideDecision(allowed, zone, idx, after, cur, prev)
  local d = windowDecision(allowed, zone, idx, after, cur, prev)
  d.c = wideAdd(cur, zone.cost)
  return d
end

ALGS.F = {
  wide = true,
  load = loadWide,

  decide = function(j, zone)
    local idx, _, _, after, cur, prev = windowAt(j, zone)
    return wideDecision(wideFits(cur, zone.cost, zone.limit), zone, idx, after, cur, prev)
  end,

  room = function()
    return 0
  end,

  settle = ALGS.f.settle,
  window = ALGS.f.window,
}

ALGS.S = {
  wide = true,
  load = loadWide,

  -- As ALGS.s: floor(prev*(w-elapsed)/w) <= room, that is
  -- prev*(w-elapsed) < (room+1)*w, compared in limbs, for the window's
  -- length w in ms (a calendar period's own: a year is below 10^11 ms,
  -- well within mulLimbs' multipliers).
  decide = function(j, zone)
    local idx, elapsed, w, after, cur, prev = windowAt(j, zone)
    local ok = wideFits(cur, zone.cost, zone.limit)
    if ok and wideCmp(prev, 0) > 0 then
      local room = wideSub(wideSub(zone.limit, zone.cost), cur)
      ok = cmpLimbs(mulLimbs(limbsOf(prev), w - elapsed), mulLimbs(addLimbs(limbsOf(room), {1}), w)) < 0
    end
    return wideDecision(ok, zone, idx, after, cur, prev)
  end,

  room = ALGS.F.room,
  settle = ALGS.f.settle,
  window = ALGS.f.window,
}
