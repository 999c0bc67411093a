-- announce.lua records that an instance sharing the store is alive, and
-- counts the instances that are, on the server's clock.
--
-- KEYS[1]  a hash of instance ids, each to when it last announced itself
--          (ms); it expires when no instance has announced itself for
--          twice ARGV[2].
-- ARGV[1]  this instance's id.
-- ARGV[2]  how long an announcement counts, in ms.
--
-- Returns how many instances announced themselves within ARGV[2] ms, this
-- one included. Older entries are removed.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], now)
local all = redis.call('HGETALL', KEYS[1])
local live = 0
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) > now - ttl then
    live = live + 1
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
return live
