-- take.lua decides a batch of requests, one after the other, each against
-- one or more zones, and takes a request's cost in its zones only if
-- every one of them allows it. Each decision is algorithms.Decide
-- (algorithms/algorithms.go) in Lua, bit for bit, and sees the takes of
-- the requests before it.
--
-- The take script is this file and the pieces after it, joined
-- by the store (takeOrder), in this order, into one script it loads once
-- and runs with EVALSHA:
--
--   take.lua                the arguments, the answer, the clock and the
--                           counters of the keys the call touches
--   arith.lua               exact integer arithmetic on doubles
--   period.lua              which window of a zone holds an instant
--   ring.lua                how a sliding window's ring rolls forward
--   tat.lua                 how a gcra key's TAT is read
--   take_bans.lua           bans, overrides and costs in flight
--   take_fixed_window.lua   the algorithms, one piece each, each adding
--   take_sliding_tail.lua   its functions to ALGS
--   take_wide.lua           (F and S: a wide zone's fixed window and
--                           sliding tail)
--   take_sliding_window.lua
--   take_gcra.lua
--   take_concurrency.lua
--   take_lease.lua          the lease rule
--   take_main.lua           reads the keys and decides the entries
--   take_write_back.lua     writes the keys back, and answers
--
-- Being one Lua chunk, each piece sees the locals of the pieces before it
-- (Redis forbids globals in scripts).
--
-- KEYS     the counters of each entry's zones, entry after entry (a
--          concurrency zone's followed by its holders' set; see
--          take_concurrency.lua): a hash per zone and key with fields w,
--          c and p, the key's algorithms.Counts (W, C and P), whose
--          meaning is the algorithm's: for the windowed algorithms w the
--          window index, c the cost taken in window w and p in window w-1;
--          for GCRA its TAT (take_gcra.lua); for concurrency the units
--          held, in c. And t (the instant, in ms of the script's clock,
--          the key was last set to expire at); o and ox, a per-key limit
--          the admin API set (take_bans.lua); b, iw, ic and ip, a ban and
--          the costs in flight (take_bans.lua); and r, a sliding window's
--          ring (take_sliding_window.lua).
-- ARGV[1]  "" to use the server clock (TIME), or a time in ms since the
--          epoch; tests drive the shared test vectors with it.
-- ARGV[2]  N, the live instances sharing the store, for leases
--          (take_lease.lua).
-- Then for each entry, which stands for m requests that are the same (the
--          same zones, keys and arguments): "1" to take in their zones
--          when all allow a request, "0" to decide only; the number n of
--          zones; m; and for each zone ZONE_ARGS arguments, at the offsets
--          ARG_* below.
--
-- Returns {now, then for each entry: how many of its m requests were
-- allowed (they are the first ones: once one is rejected, the rest are
-- decided against the same counters), and for each zone ZONE_VALUES
-- numbers, at the offsets OUT_* below}. The caller rebuilds what each of
-- the entry's requests saw by taking them one after the other, as
-- algorithms.Decide does, and banning as this script does. An entry for
-- many identical requests (one hot key under load) costs little more than
-- one for a single request: its arguments are read once and its answer is
-- eight numbers a zone.
--
-- Each key is read once and written at most once per call, after all
-- requests are decided, with the counts they left. Its expiry is set only
-- when it must move later: within a window it is already right.

-- A zone's arguments, at ARGV[a + ARG_*] from its first argument ARGV[a]:
-- the algorithm ("f" fixed window, "s" sliding tail, "w" sliding window,
-- "g" gcra, "c" concurrency; "F" and "S" the fixed window and the sliding
-- tail of a wide zone, whose counts run to 2^63 - 1, see take_wide.lua);
-- the limit; the window (ms; for concurrency the hold; for a calendar
-- period, the periods around the caller's clock: period.lua); the
-- cost; one more: gcra's burst (0: the limit), a sliding window's
-- buckets, concurrency's holder, "" otherwise; the lease wanted: how many
-- units beyond the cost the instance would like to take later on its own
-- (0 for none); the ban (ms; 0 for none); and "1" if the zone keeps its
-- costs in flight (it bans, and releases costs: count_status; or the
-- cost is a reservation, cost_from), "0" if not. The store's Go code
-- mirrors these offsets (arg*).
local ARG_ALG, ARG_LIMIT, ARG_WINDOW, ARG_COST, ARG_EXTRA, ARG_LEASE, ARG_BAN, ARG_INFLIGHT = 0, 1, 2, 3, 4, 5, 6, 7
local ZONE_ARGS = 8

-- A zone's answer, at out[zone.base + OUT_*] from its first value
-- out[zone.base]: w, c and p as stored before the entry (0 when absent; a
-- sliding window answers other numbers in their place, see
-- take_sliding_window.lua); whether the zone alone allows the entry's
-- first request not allowed (1/0; 1 when all were); the limit it was
-- decided against; the units leased (0 when none); b as stored before the
-- entry (0 when absent); and 1 if the zone keeps its costs in flight,
-- rejected that request, and would have allowed it on the settled count
-- alone (so it banned nothing), 0 otherwise. The store's Go code mirrors
-- these offsets (out*).
local OUT_W, OUT_C, OUT_P, OUT_ALLOWS, OUT_LIMIT, OUT_LEASED, OUT_BAN, OUT_INFLIGHT = 0, 1, 2, 3, 4, 5, 6, 7
local ZONE_VALUES = 8

-- The counters of every key the call touches, as the requests so far left
-- them, KEY_SLOTS slots per key from s[j], j = at[key], at s[j + *]: the
-- key (KEY), w (W; false when Redis does not hold the key), c (C), p (P),
-- t (T), what to write at the end (WRITE), the override in force (OVER;
-- false if none), the holders' set of a concurrency key (HOLDERS; false
-- for others), b (BAN; 0 when absent), and iw, ic, ip (IW, IC, IP; 0 when
-- absent). Flat arrays keep the tables per call few.
local KEY, W, C, P, T, WRITE, OVER, HOLDERS, BAN, IW, IC, IP = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11
local KEY_SLOTS = 12
-- What to write at the end: nothing, the counts, or the counts and a later
-- expiry.
local WRITE_NONE, WRITE_COUNTS, WRITE_EXPIRY = 0, 1, 2
local at, s, ns = {}, {}, 0
-- The rings of sliding-window keys, by j: the counts as a table, as the
-- requests so far left them (take_sliding_window.lua).
local rings = {}

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local instances = math.max(tonumber(ARGV[2]) or 1, 1)

local out = {now}

-- The algorithms, by the letter ARG_ALG names them with; each piece adds
-- one, a table of functions of a zone (see take_main.lua) whose key's
-- counters are at s[j]:
--   load(j, holders, w, c, p, o, ic, ip)
--                         reads what the algorithm keeps besides w, c, p
--                         and t, when the call first reads the key, or
--                         keeps the fields c, p, o, ic and ip as read
--                         (optional);
--   decide(j, zone)       decides the zone's request against the counters
--                         as the requests before it left them; returns a
--                         decision (below);
--   room(j, zone)         the units the zone has left, as the requests so
--                         far left it (take_lease.lua);
--   lease(j, zone, units) leases units more (take_lease.lua);
--   settle(j, zone)       takes the key's costs in flight off its
--                         counters (take_bans.lua);
--   window(zone, d)       the window, of the zone's window, the decision
--                         d takes its cost in (take_bans.lua);
--   answer(zone, d, first) writes what the zone answers in place of w, c
--                         and p, for the decision d on a request, the
--                         entry's first or not (optional);
--   wide                  true for the algorithms of wide zones, whose
--                         counts, limit and cost stay decimal strings
--                         (take_wide.lua).
-- A decision is {allowed: whether the zone allows the request; w, c, p:
-- the fields taking it writes; ring: the ring taking it writes for a
-- sliding window, in place of c and p; expires: until when taking it
-- keeps the key; holder: the holder it adds (concurrency); used and
-- retry: what a sliding window answers (take_sliding_window.lua)}. A
-- request that can never be taken (more than gcra's burst) has a
-- decision holding only allowed.
local ALGS = {}

-- decide decides one zone of a request with its algorithm.
local function decide(j, zone)
  return ALGS[zone.alg].decide(j, zone)
end
