-- admin.lua changes one key's admin state for the admin API, atomically in
-- the key's slot, on the server's clock.
--
-- KEYS[1]  the counter hash (see take.lua).
-- ARGV[1]  the change:
--          "reset"       forget the counts (w, c, p, t, r) and lift the ban
--                        (b), keep an override and the costs in flight
--                        (iw, ic, ip), which their requests' ends take
--                        off;
--          "override"    set the per-key limit ARGV[2] for ARGV[3] ms (0:
--                        for good); the hash then lives as long as the
--                        longer of the override and the counts;
--          "unoverride"  remove the override; the hash then lives as long
--                        as its counts, if they still matter.
--
-- Returns 1.

local key, op = KEYS[1], ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if op == 'reset' then
  if redis.call('HEXISTS', key, 'o') == 1 or redis.call('HEXISTS', key, 'iw') == 1 then
    redis.call('HDEL', key, 'w', 'c', 'p', 't', 'b', 'r')
  else
    redis.call('DEL', key)
  end
elseif op == 'override' then
  local ttl = tonumber(ARGV[3])
  local ends = 0
  if ttl > 0 then
    ends = now + ttl
  end
  redis.call('HSET', key, 'o', ARGV[2], 'ox', ends)
  if ends == 0 then
    redis.call('PERSIST', key)
  else
    local counts = tonumber(redis.call('HGET', key, 't')) or 0
    redis.call('PEXPIREAT', key, math.max(ends, counts))
  end
elseif op == 'unoverride' then
  redis.call('HDEL', key, 'o', 'ox')
  local counts = tonumber(redis.call('HGET', key, 't')) or 0
  if counts > now then
    redis.call('PEXPIREAT', key, counts)
  else
    redis.call('DEL', key)
  end
else
  return redis.error_reply('admin.lua: unknown change ' .. tostring(op))
end
return 1
