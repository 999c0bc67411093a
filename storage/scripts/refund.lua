-- refund.lua takes back a charge made by take.lua, when a request was
-- charged in some cluster slots and then rejected in another. It runs
-- atomically in one slot, like the charge it undoes.
--
-- KEYS[i]            counters of the i-th zone and key (see take.lua).
-- ARGV[2i-1], ARGV[2i]  the window index the cost was charged in, and the
--                       cost.
--
-- A charge still in the current window comes off c; one that has since
-- become the previous window comes off p; an older one no longer counts.
-- Counts never go below zero, and the key keeps its expiry.

for i = 1, #KEYS do
  local idx = tonumber(ARGV[2 * i - 1])
  local cost = tonumber(ARGV[2 * i])
  local v = redis.call('HMGET', KEYS[i], 'w', 'c', 'p')
  if v[1] then
    local w = tonumber(v[1])
    if w == idx then
      redis.call('HSET', KEYS[i], 'c', math.max((tonumber(v[2]) or 0) - cost, 0))
    elseif w == idx + 1 then
      redis.call('HSET', KEYS[i], 'p', math.max((tonumber(v[3]) or 0) - cost, 0))
    end
  end
end
return 1
