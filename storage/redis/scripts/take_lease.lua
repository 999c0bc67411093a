-- take_lease.lua: the lease rule. Reads instances (N, ARGV[2]); charges
-- the key state through each algorithm's room and grant, marks the key
-- to be written (s[j + WRITE]), and answers OUT_LEASED.
--
-- When an entry of one request (m = 1) is allowed and charged, each zone
-- that asked for a lease is charged up to that many more units, but never
-- more than floor(room / 2N), where room is what the zone has left after
-- the request: the instance spends them later without a call. Every
-- leased unit is counted here before it is spent, and the last units of a
-- window are left to be decided one at a time.

-- grantLeases charges the leases the n zones of an entry ask for, its
-- one request having just been allowed and charged.
local function leaseUnits(zones, n)
  for z = 1, n do
    local zone = zones[z]
    if zone.lease > 0 then
      local j, alg = zone.j, ALGS[zone.alg]
      local units = math.min(zone.lease, math.floor(alg.room(j, zone) / (2 * instances)))
      if units > 0 then
        alg.lease(j, zone, units)
        out[zone.base + OUT_LEASED] = units
        if s[j + WRITE] == WRITE_NONE then
          s[j + WRITE] = WRITE_COUNTS
        end
      end
    end
  end
end
