-- take_bans.lua: bans, per-key overrides and costs in flight, the admin
-- and ban state a key's hash keeps beside its counts. Reads and writes
-- the key state s at BAN, IW, IC, IP, OVER and T/WRITE (a ban moves the
-- expiry), and answers OUT_INFLIGHT.
--
-- Overrides: when the admin API set a per-key limit, the hash holds it
-- in o, and in ox when it ends (ms; 0 for never). While the override is
-- in force it replaces the request's limit, and the key's expiry is the
-- admin call's to set, not this script's (take_write_back.lua).
--
-- Bans: a zone with a ban rejects every request while the key's ban (b,
-- when it ends, in ms) has not ended, whatever its counts; and when it
-- rejects a request of a key that is not banned, the key is banned from
-- now for the zone's ban. The ban lives in the key's hash, beside its
-- counts, which then live at least as long.
--
-- Costs in flight: a zone that bans and releases costs, and a cost_from
-- zone's reservations, keep, as algorithms/inflight.go does, the costs of
-- their requests not done yet (finish.lua takes them off): iw is a
-- window (of the zone's window), ic the costs taken in it, ip those taken
-- in window iw-1. A zone that bans bans only if the key's settled count
-- alone, the counts less the costs in flight (algorithms.Settled), leaves
-- the request no room: a refusal only for costs in flight bans nothing.
-- A zone without a ban keeps them only for the admin API to show
-- (key_state.lua): they change none of its decisions.

-- The keys this call banned, and those whose costs in flight it changed,
-- by j.
local banned, flying = {}, {}

-- override returns the per-key limit in force for key, from its fields o
-- and ox as read (false if none is), and its t. An override that has
-- ended is forgotten, and t with it, so that the counters expire as they
-- would without it.
local function override(key, o, ox, t)
  local over = tonumber(o) or false
  ox = tonumber(ox) or 0
  if over and ox ~= 0 and ox <= now then
    redis.call('HDEL', key, 'o', 'ox')
    return false, 0
  end
  return over, t
end

-- bannedNow reports whether the zone's ban rejects its request: the zone
-- bans, and the key's ban has not ended.
local function bannedNow(zone)
  return zone.ban > 0 and s[zone.j + BAN] > now
end

-- inflight returns the costs in flight kept at s[j] that still count at
-- now, for a window of w ms: those taken in this window or the one before
-- (algorithms/inflight.go).
local function inflight(j, w)
  local iw, idx = s[j + IW], floordiv(now, w)
  if iw < idx - 1 then
    return 0
  elseif iw == idx - 1 then
    return s[j + IC]
  end
  return s[j + IC] + s[j + IP]
end

-- takeInflight adds cost, taken in window win, to the costs in flight at
-- s[j], as algorithms.TakeInFlight does.
local function takeInflight(j, win, cost)
  local iw = s[j + IW]
  if iw < win then
    local prev = 0
    if iw == win - 1 then
      prev = s[j + IC]
    end
    s[j + IW], s[j + IC], s[j + IP] = win, cost, prev
  elseif iw == win then
    s[j + IC] = plus(s[j + IC], cost)
  elseif iw == win + 1 then
    s[j + IP] = plus(s[j + IP], cost)
  end
  flying[j] = true
end

-- settledAllows reports whether the zone would allow its request on the
-- key's settled count: its counters, as the requests so far left them,
-- less the costs in flight, as its algorithm's settle takes them off. The
-- counters are left as they were.
local function settledAllows(zone)
  local j = zone.j
  local sw, sc, sp, ring = s[j + W], s[j + C], s[j + P], rings[j]
  ALGS[zone.alg].settle(j, zone)
  local ok = decide(j, zone).allowed
  s[j + W], s[j + C], s[j + P], rings[j] = sw, sc, sp, ring
  return ok
end

-- passesEver reports whether the zone's request could ever pass: it
-- costs at most a gcra zone's burst (its extra argument, 0 for the
-- limit), else the limit, as algorithms.Capacity. A wide zone's cost and
-- limit are decimal strings, which Lua would compare as text.
local function passesEver(zone)
  if ALGS[zone.alg].wide then
    return wideCmp(zone.cost, zone.limit) <= 0
  end
  local burst = tonumber(zone.extra)
  if zone.alg == 'g' and burst and burst > 0 then
    return zone.cost <= burst
  end
  return zone.cost <= zone.limit
end

-- banRejecting applies the ban rule to the n zones of an entry whose
-- request was rejected: each zone with a ban that rejected it bans its
-- key, unless the key is banned already, the request's cost could never
-- pass, or the zone keeps its costs in flight and the settled count
-- alone has room for the request.
local function banRejecting(zones, n)
  for z = 1, n do
    local zone = zones[z]
    local j = zone.j
    if zone.ban > 0 and out[zone.base + OUT_ALLOWS] == 0 and s[j + BAN] <= now and passesEver(zone) then
      if zone.inflight and settledAllows(zone) then
        out[zone.base + OUT_INFLIGHT] = 1
      else
        s[j + BAN] = now + zone.ban
        banned[j] = true
        if s[j + BAN] > s[j + T] then
          s[j + T], s[j + WRITE] = s[j + BAN], WRITE_EXPIRY
        elseif s[j + WRITE] == WRITE_NONE then
          s[j + WRITE] = WRITE_COUNTS
        end
      end
    end
  end
end
