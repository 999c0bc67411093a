-- take_lease.lua: the lease rule. Reads instances (N, ARGV[2]); leases
-- units in the key state through each algorithm's room and lease, marks
-- the key to be written (s[j + WRITE]), and answers OUT_LEASED.
--
-- When an entry of one request (m = 1) is allowed and taken, each zone
-- that wants a lease leases up to that many more units, but never more
-- than floor(room / 2N), where room is what the zone has left after the
-- request: the instance takes them later without a call. Every leased
-- unit is counted here before it is taken, and the last units of a
-- window are left to be decided one at a time.

-- leaseUnits leases the units the n zones of an entry want, its one
-- request having just been allowed and taken.
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
