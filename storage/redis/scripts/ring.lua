-- ring.lua: how a sliding window's ring of n+1 sub-window counts is
-- rolled forward. Pure, like arith.lua; the finish script
-- (finish.lua) begins with it too, so that a release rolls a ring as a
-- take does.

-- rollRing returns old, the ring of sub-window sw, rolled forward to
-- sub-window idx for n buckets, as a new table, and idx, which is sw if
-- the clock reads an earlier one. A ring kept for another n is folded
-- into the current sub-window whole: it counts for longer, never
-- shorter. A ring more than a window ahead was kept for a shorter window
-- (the zone's window grew in a reload): its counts start afresh.
local function rollRing(old, sw, n, idx)
  local r = {}
  for i = 1, n + 1 do
    r[i] = 0
  end
  if #old == n + 1 and sw > idx + n then
    return r, idx
  end
  if #old ~= n + 1 then
    local total = 0
    for _, c in ipairs(old) do
      total = total + c
    end
    r[idx % (n + 1) + 1] = total
    return r, idx
  end
  if sw > idx then
    idx = sw
  end
  if idx - sw <= n then
    for i = 1, n + 1 do
      r[i] = old[i]
    end
    for k = sw + 1, idx do
      r[k % (n + 1) + 1] = 0
    end
  end
  return r, idx
end
