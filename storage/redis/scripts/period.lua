-- period.lua: which window of a zone holds an instant, its start and
-- end, and the next window's end. Reads and writes no state: every
-- function here is pure. The finish script (finish.lua) begins with it
-- too, for a true-up's debt.
--
-- A zone's windows are of a length, aligned to the epoch, or calendar
-- periods (algorithms.Calendar): a day, week, month or year from local
-- midnight in a time zone. Lua in Redis knows no time zones, so for a
-- calendar period the caller computes the periods around its own clock's
-- now (algorithms.Calendar.Around) and passes them in place of the
-- window's length, as "first,s1,s2,s3,s4,s5,s6": the index of the period
-- before its own, and the starts (ms) of that period and the five after
-- it. The script picks among the first three, the caller's period and the
-- ones on either side, the one Redis's clock is in: every instance then
-- counts in the period Redis's clock says, whatever its own clock says,
-- as long as the two are less than a period apart. A period is then the
-- table {first = <index>, <s1>, ..., <s6>}, and a window of a length its
-- length in ms, a number.

-- readPeriod reads a zone's windows from its window argument: a length
-- in ms, or a calendar period's "first,s1,...,s6".
local function readPeriod(arg)
  local w = tonumber(arg)
  if w then
    return w
  end
  local p, k = {}, 0
  for v in string.gmatch(arg, '[^,]+') do
    if k == 0 then
      p.first = tonumber(v)
    else
      p[k] = tonumber(v)
    end
    k = k + 1
  end
  return p
end

-- periodAt returns the index of the window of p that holds the instant t
-- (ms), when it starts and ends, and when the window after it ends. A
-- calendar period must be one of the three around the caller's: an
-- instant further off is an error, a clock a period or more from the
-- caller's.
local function periodAt(p, t)
  if type(p) == 'number' then
    local idx = floordiv(t, p)
    return idx, idx * p, (idx + 1) * p, (idx + 2) * p
  end
  for k = 1, 3 do
    if p[k] <= t and t < p[k + 1] then
      return p.first + k - 1, p[k], p[k + 1], p[k + 2]
    end
  end
  error('rate_limit: the Redis server\'s clock (' .. t .. ' ms) is a calendar period or more from the instance\'s')
end

-- periodOf returns when window idx of p starts and ends, and when the
-- window after it ends; for a calendar period, idx is at most one after
-- the three periodAt picks from.
local function periodOf(p, idx)
  if type(p) == 'number' then
    return idx * p, (idx + 1) * p, (idx + 2) * p
  end
  local k = idx - p.first + 1
  return p[k], p[k + 1], p[k + 2]
end
