-- take_main.lua: reads each entry's arguments and, the first time the
-- call meets it, each key's hash into the key state (s, at KEY_SLOTS slots
-- a key); decides the entry's requests one after the other, taking them
-- in the key state; then applies the ban rule (take_bans.lua) and the lease rule
-- (take_lease.lua). Writes the answer's allowed count and OUT_ALLOWS, and
-- each zone's answer as stored before the entry.
--
-- A zone of the entry is a table: j, where its key's counters are; alg,
-- limit (the override's, if one is in force), window, cost, extra, lease
-- and ban, its arguments; period, its windows (period.lua: the
-- window, or a calendar period, whose zone has no window); inflight,
-- whether it keeps its costs in flight; and base, where its answer starts
-- (out[base + OUT_*]).

-- load reads key's hash into the key state, at a new j, and returns j:
-- its counts, override, ban and costs in flight, and what its algorithm
-- alg keeps besides (holders, a concurrency key's set; window, the
-- zone's), or keeps otherwise (a wide zone's counts, as the strings
-- read).
local function load(key, alg, holders, window)
  local j = ns + 1
  ns = ns + KEY_SLOTS
  at[key] = j
  local w, c, p, t, o, ox, b, iw, ic, ip = unpack(redis.call('HMGET', key, 'w', 'c', 'p', 't', 'o', 'ox', 'b', 'iw', 'ic', 'ip'))
  local over
  over, t = override(key, o, ox, tonumber(t) or 0)
  s[j + KEY], s[j + W], s[j + C], s[j + P], s[j + T] = key, tonumber(w) or false, tonumber(c) or 0, tonumber(p) or 0, t
  s[j + WRITE], s[j + OVER], s[j + HOLDERS] = WRITE_NONE, over, false
  s[j + BAN], s[j + IW], s[j + IC], s[j + IP] = tonumber(b) or 0, tonumber(iw) or 0, tonumber(ic) or 0, tonumber(ip) or 0
  local read = ALGS[alg].load
  if read then
    read(j, holders, window, c, p, o, ic, ip)
  end
  return j
end

-- commit takes the zone's request, as decide found it (the decision d),
-- in the key state: its counts, its expiry, its holder and its cost in
-- flight.
local function commit(zone, d)
  local j = zone.j
  if d.ring then
    s[j + W], rings[j] = d.w, d.ring
  else
    s[j + W], s[j + C], s[j + P] = d.w, d.c, d.p
  end
  if d.expires > s[j + T] then
    s[j + T], s[j + WRITE] = d.expires, WRITE_EXPIRY
  elseif s[j + WRITE] == WRITE_NONE then
    s[j + WRITE] = WRITE_COUNTS
  end
  if d.holder then
    redis.call('ZADD', s[j + HOLDERS], d.expires, d.holder)
  end
  if zone.inflight then
    takeInflight(j, ALGS[zone.alg].window(zone, d), zone.cost)
  end
end

-- k is the last key read, a the entry's first argument, o the last value
-- of the answer. zones holds the current entry's zones, and decisions the
-- current request's decision for each: their first n are the entry's, and a
-- zone's table is reused from entry to entry, every field set anew.
local k, a, o = 0, 3, 1
local zones, decisions = {}, {}
while a <= #ARGV do
  local take = ARGV[a] == '1'
  local n = tonumber(ARGV[a + 1])
  local m = tonumber(ARGV[a + 2])
  a = a + 3
  -- out[first] will be how many of the entry's m requests were allowed,
  -- and the zones' answers follow.
  local first = o + 1
  o = first + ZONE_VALUES * n
  for z = 1, n do
    k = k + 1
    local key = KEYS[k]
    local alg = ARGV[a + ARG_ALG]
    local holders = false
    if alg == 'c' then
      k = k + 1
      holders = KEYS[k]
    end
    local w = tonumber(ARGV[a + ARG_WINDOW])
    local j = at[key] or load(key, alg, holders, w)
    local zone = zones[z] or {}
    zones[z] = zone
    zone.j = j
    zone.alg = alg
    -- A wide zone's limit and cost stay the strings they came as.
    local count = ALGS[alg].wide and tostring or tonumber
    zone.limit = s[j + OVER] or count(ARGV[a + ARG_LIMIT])
    zone.window = w
    zone.period = w or readPeriod(ARGV[a + ARG_WINDOW])
    zone.cost = count(ARGV[a + ARG_COST])
    zone.extra = ARGV[a + ARG_EXTRA]
    zone.lease = tonumber(ARGV[a + ARG_LEASE])
    zone.ban = tonumber(ARGV[a + ARG_BAN])
    zone.inflight = ARGV[a + ARG_INFLIGHT] == '1'
    zone.base = first + 1 + ZONE_VALUES * (z - 1)
    -- The zone's counters and ban as stored before the entry, its limit,
    -- no lease yet, and no refusal for costs in flight; the verdict, the
    -- lease and that refusal are set below.
    local b = zone.base
    out[b + OUT_W], out[b + OUT_C], out[b + OUT_P], out[b + OUT_LIMIT], out[b + OUT_LEASED], out[b + OUT_BAN], out[b + OUT_INFLIGHT] =
      s[j + W] or 0, s[j + C], s[j + P], zone.limit, 0, s[j + BAN], 0
    a = a + ZONE_ARGS
  end

  -- The entry's requests, one after the other. Each sees the takes of
  -- the ones before it; once one is rejected, the rest would be decided
  -- against the same counters, and are rejected too.
  local allowed = 0
  for i = 1, m do
    local all = true
    for z = 1, n do
      local zone = zones[z]
      local d = decide(zone.j, zone)
      local answer = ALGS[zone.alg].answer
      if answer then
        answer(zone, d, i == 1)
      end
      local ok = d.allowed and not bannedNow(zone)
      out[zone.base + OUT_ALLOWS] = ok and 1 or 0
      all = all and ok
      decisions[z] = d
    end
    if not all then
      break
    end
    if not take then
      -- Nothing changes: every one of them is allowed.
      allowed = m
      break
    end
    allowed = allowed + 1
    for z = 1, n do
      commit(zones[z], decisions[z])
    end
  end
  out[first] = allowed
  if allowed < m then
    banRejecting(zones, n)
  end
  if take and m == 1 and allowed == 1 then
    leaseUnits(zones, n)
  end
end
