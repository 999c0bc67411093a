-- tat.lua: how a gcra key's theoretical arrival time (TAT) is read from
-- its hash. Pure, like arith.lua, whose muldiv it uses; the take script
-- (take_gcra.lua, to decide) and the finish script (finish.lua, to take
-- a debt) both begin with it, so that both read a TAT alike.

-- tatOf reads a gcra key's TAT as its hash holds it (w, c, p: ms, and a
-- fraction c/p of a ms) as (ms, fraction in 1/limit ms), limit being the
-- rate it is decided at now: a fraction kept for another limit is
-- rescaled, rounded down and kept below a whole ms.
local function tatOf(sw, sc, sp, limit)
  local ms, f = sw or 0, 0
  if sp > 0 and sc > 0 then
    if sp == limit then
      f = sc
    else
      f = math.min(muldiv(sc, limit, sp), limit - 1)
    end
  end
  return ms, f
end
