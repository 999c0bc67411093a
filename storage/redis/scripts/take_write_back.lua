-- take_write_back.lua: writes each key the call touched back to Redis,
-- once, with the counts the requests left, as s[j + WRITE] says: nothing,
-- the counts (and a concurrency key's holders' set's expiry, t), or the
-- counts and a later expiry (t, and the key's and its holders' set's
-- PEXPIRE); and the ban, the costs in flight and a sliding window's ring
-- if they changed. Then answers out.

for j = 1, ns, KEY_SLOTS do
  local key, write = s[j + KEY], s[j + WRITE]
  -- A key first seen by a rejection that banned it has no window yet.
  local w = s[j + W] or 0
  if banned[j] then
    redis.call('HSET', key, 'b', s[j + BAN])
  end
  if flying[j] then
    redis.call('HSET', key, 'iw', s[j + IW], 'ic', s[j + IC], 'ip', s[j + IP])
  end
  if rings[j] and write ~= WRITE_NONE then
    redis.call('HSET', key, 'r', table.concat(rings[j], ','))
  end
  if write == WRITE_EXPIRY then
    -- t is written under an override too, so that removing the override
    -- keeps the counts for as long as they matter.
    redis.call('HSET', key, 'w', w, 'c', s[j + C], 'p', s[j + P], 't', s[j + T])
    if not s[j + OVER] then
      redis.call('PEXPIRE', key, s[j + T] - now)
    else
      -- Under an override the admin call sets the expiry; counts that
      -- outlive it move it.
      local ttl = redis.call('PTTL', key)
      if ttl >= 0 and now + ttl < s[j + T] then
        redis.call('PEXPIRE', key, s[j + T] - now)
      end
    end
    if s[j + HOLDERS] then
      redis.call('PEXPIRE', s[j + HOLDERS], s[j + T] - now)
    end
  elseif write ~= WRITE_NONE then
    redis.call('HSET', key, 'w', w, 'c', s[j + C], 'p', s[j + P])
    if s[j + HOLDERS] then
      -- The holders' set may be new though t is not: when the release of
      -- its last holder emptied it (Redis removes an empty set) in the
      -- millisecond of the take that set t, a take in that millisecond
      -- makes it again, without the expiry that take gave it.
      redis.call('PEXPIRE', s[j + HOLDERS], s[j + T] - now)
    end
    if banned[j] and s[j + OVER] then
      -- Under an override the admin call sets the expiry; a ban that
      -- ends later moves it, and t with it, so that removing the
      -- override keeps the ban.
      redis.call('HSET', key, 't', s[j + T])
      local ttl = redis.call('PTTL', key)
      if ttl >= 0 and now + ttl < s[j + BAN] then
        redis.call('PEXPIRE', key, s[j + BAN] - now)
      end
    end
  end
end
return out
