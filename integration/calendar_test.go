package integration

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/admin"
	"github.com/d61b427a/caddy-rate-limit/internal/docs"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// Caddy's clock cannot be moved, so these tests check a calendar
// period's end as a client sees it against the period Go's own calendar
// (time.Date) says holds now; the count's reset at a period's start is
// tested in the stores, on clocks the tests move (storage/storetest,
// algorithms/vectors).

// calendarPeriod is a calendar period in a time zone, as a test computes
// it: period "day", "week" or "month" in the zone called zone.
type calendarPeriod struct {
	period, zone string
}

// bounds returns when the period that holds t starts and ends: local
// midnight on its first date and on the next period's. (time.Date is
// right for every date whose midnight exists; none of the tests' zones
// skips one.)
func (p calendarPeriod) bounds(t *testing.T, at time.Time) (start, end time.Time) {
	t.Helper()
	loc, err := time.LoadLocation(p.zone)
	if err != nil {
		t.Fatal(err)
	}
	y, m, d := at.In(loc).Date()
	switch p.period {
	case "day":
		return time.Date(y, m, d, 0, 0, 0, 0, loc), time.Date(y, m, d+1, 0, 0, 0, 0, loc)
	case "week":
		back := (int(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Weekday()) + 6) % 7 // days since Monday
		return time.Date(y, m, d-back, 0, 0, 0, 0, loc), time.Date(y, m, d-back+7, 0, 0, 0, 0, loc)
	case "month":
		return time.Date(y, m, 1, 0, 0, 0, 0, loc), time.Date(y, m+1, 1, 0, 0, 0, 0, loc)
	}
	t.Fatalf("unknown period %q", p.period)
	return
}

// during runs ask and returns the period that held the instants before
// and after it, and those instants. A test that straddled the period's
// end cannot tell which period an answer was in, and is skipped.
func (p calendarPeriod) during(t *testing.T, ask func()) (start, end, sent, got time.Time) {
	t.Helper()
	sent = time.Now()
	ask()
	got = time.Now()
	start, end = p.bounds(t, got)
	if _, before := p.bounds(t, sent); !before.Equal(end) {
		t.Skipf("the %s in %s ended while the test ran", p.period, p.zone)
	}
	return start, end, sent, got
}

// seconds is the wait from an instant between sent and got until until,
// in whole seconds rounded up, as Retry-After and RateLimit's t say it:
// at least least, at most most.
func seconds(until, sent, got time.Time) (least, most int64) {
	ceil := func(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }
	return ceil(until.Sub(got)), ceil(until.Sub(sent))
}

// TestCalendarPeriodsThroughCaddy: zones whose windows are a month in New
// York, a week in Paris and a day in Tokyo, on the memory store, tell a
// client the real end of the current period: X-RateLimit-Reset the
// period's end, RateLimit's t the seconds to it and RateLimit-Policy's w
// the period's own length. A fixed window's key over its limit waits
// until the period ends, a sliding tail's with no period before until a
// millisecond after (its count, carried into the next period, has to
// decay below the limit). The admin API shows each zone's window as
// written, its time zone and the period's end, and a key's reset there.
func TestCalendarPeriodsThroughCaddy(t *testing.T) {
	zones := []struct {
		name, algorithm string
		calendarPeriod
	}{
		{"monthly_new_york", "fixed_window", calendarPeriod{"month", "America/New_York"}},
		{"weekly_paris", "sliding_tail", calendarPeriod{"week", "Europe/Paris"}},
		{"daily_tokyo", "fixed_window", calendarPeriod{"day", "Asia/Tokyo"}},
	}
	var config strings.Builder
	for _, z := range zones {
		fmt.Fprintf(&config, `
		zone %s {
			match {
				path /%s
			}
			key {header.X-Api-Key}
			limit 3
			window %s
			timezone %s
			algorithm %s
		}`, z.name, z.name, z.period, z.zone, z.algorithm)
	}
	startCaddy(t, `
`+siteAddr+` {
	rate_limit {
		headers both`+config.String()+`
	}
	respond "ok"
}
`)
	for _, z := range zones {
		t.Run(z.name, func(t *testing.T) {
			url := siteURL + "/" + z.name
			for i := range 3 {
				var resp *http.Response
				start, end, sent, got := z.during(t, func() { resp, _ = do(t, http.MethodGet, url, "X-Api-Key: customer-1") })
				status(t, resp, http.StatusOK)
				if reset := resp.Header.Get("X-Ratelimit-Reset"); reset != strconv.FormatInt(end.Unix(), 10) {
					t.Fatalf("request %d: X-RateLimit-Reset %s, want the end of the %s in %s, %d (%s)", i+1, reset, z.period, z.zone, end.Unix(), end)
				}
				if policy, want := resp.Header.Get("Ratelimit-Policy"), fmt.Sprintf(`"%s";q=3;w=%d`, z.name, end.Sub(start)/time.Second); policy != want {
					t.Fatalf("request %d: RateLimit-Policy %s, want %s, the %s's length", i+1, policy, want, z.period)
				}
				prefix := fmt.Sprintf(`"%s";r=%d;t=`, z.name, 2-i)
				rl := resp.Header.Get("Ratelimit")
				secs, err := strconv.ParseInt(strings.TrimPrefix(rl, prefix), 10, 64)
				if least, most := seconds(end, sent, got); !strings.HasPrefix(rl, prefix) || err != nil || secs < least || secs > most {
					t.Fatalf("request %d: RateLimit %s, want %s and the %d to %d seconds to %s", i+1, rl, prefix, least, most, end)
				}
			}
			var resp *http.Response
			_, end, sent, got := z.during(t, func() { resp, _ = do(t, http.MethodGet, url, "X-Api-Key: customer-1") })
			status(t, resp, http.StatusTooManyRequests)
			retry := end
			if z.algorithm == "sliding_tail" {
				retry = end.Add(time.Millisecond)
			}
			ra, err := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
			if least, most := seconds(retry, sent, got); err != nil || ra < least || ra > most {
				t.Fatalf("over the limit: Retry-After %q, want %d to %d seconds, until %s", resp.Header.Get("Retry-After"), least, most, retry)
			}

			var zone admin.ZoneInfo
			var key admin.KeyInfo
			_, end, _, _ = z.during(t, func() {
				zone, _ = zoneState(t, adminURL, z.name)
				key = keyState(t, adminURL, z.name, "customer-1")
			})
			if zone.Window != z.period || zone.Timezone != z.zone || !zone.PeriodEnds.Equal(end) {
				t.Fatalf("GET zones: %+v, want window %s in %s, ending %s", zone, z.period, z.zone, end)
			}
			if key.Used != 3 || !key.Reset.Equal(end) {
				t.Fatalf("GET the key: %+v, want used 3 until %s", key, end)
			}
		})
	}
}

// TestRedisFleetCalendarPeriod: three Caddy processes on one Redis, with
// lease off and on, share a zone of 30 calls a month per key in New York.
// A burst of 90 admits 30 at most (with lease off, exactly 30); every
// answer, from any instance, gives the month's end in X-RateLimit-Reset,
// and every refusal the seconds to it in Retry-After. An instance moves
// the instants Redis decides to its own clock by how far that is from
// Redis's, as it measures it, round trip included: milliseconds here,
// which the headers' rounding up to whole seconds may make one more
// second. Redis keeps the key's counts in the month's index, months since
// January 1970 in New York, until the end of the next month; every
// instance's admin API shows the key's reset at the month's end.
func TestRedisFleetCalendarPeriod(t *testing.T) {
	month := calendarPeriod{"month", "America/New_York"}
	for _, lease := range []string{"off", "on"} {
		t.Run("lease "+lease, func(t *testing.T) {
			s := redistest.Standalone(t)
			fleet := startFleet(t, 3, fleetSpec{store: "address " + s.URL() + "\nlease " + lease,
				zone: "\t\t\tkey {header.X-Client}\n\t\t\tlimit 30\n\t\t\twindow month\n\t\t\ttimezone America/New_York\n\t\t\talgorithm fixed_window"})
			waitForFleet(t, fleet)
			var answers []result
			start, end, sent, got := month.during(t, func() {
				ch := sendAll(t.Context(), urls(fleet), 90, "X-Client: monthly")
				for range 90 {
					answers = append(answers, receive(t, "an answer", ch))
				}
			})
			codes := map[int]int{}
			least, most := seconds(end, sent, got)
			for _, a := range answers {
				if a.err != nil {
					t.Fatal(a.err)
				}
				codes[a.status]++
				if reset, err := strconv.ParseInt(a.header.Get("X-Ratelimit-Reset"), 10, 64); err != nil || reset != end.Unix() && reset != end.Unix()+1 {
					t.Fatalf("%d answer: X-RateLimit-Reset %s, want the month's end in New York, %d (%s)", a.status, a.header.Get("X-Ratelimit-Reset"), end.Unix(), end)
				}
				if a.status == http.StatusTooManyRequests {
					if ra, err := strconv.ParseInt(a.header.Get("Retry-After"), 10, 64); err != nil || ra < least || ra > most+1 {
						t.Fatalf("refusal: Retry-After %q, want %d to %d seconds, until %s", a.header.Get("Retry-After"), least, most+1, end)
					}
				}
			}
			admitted := codes[http.StatusOK]
			if admitted > 30 || lease == "off" && admitted != 30 || codes[http.StatusOK]+codes[http.StatusTooManyRequests] != 90 {
				t.Fatalf("a burst of 90 for 30 a month: %v", codes)
			}
			key := counterKey(t, s, "fleet", clientKey("monthly"))
			y, m, _ := start.Date()
			_, nextEnd := month.bounds(t, end)
			fields, err := s.Do("HMGET", key, "w", "t")
			if want := fmt.Sprintf("%d\n%d", (y-1970)*12+int(m)-1, nextEnd.UnixMilli()); err != nil || fields != want {
				t.Fatalf("Redis keeps the key's window and expiry as %s (%v), want %s: this month in New York, until next month's end", fields, err, want)
			}
			for _, in := range fleet {
				if k := keyState(t, in.admin, "fleet", "monthly"); !k.Reset.Equal(end) || k.Used != int64(admitted) && lease == "off" {
					t.Fatalf("%s: the key %+v, want used %d until %s", in.admin, k, admitted, end)
				}
			}
		})
	}
}

// TestMonthlyQuotaRecipe runs docs/examples.md's recipe "10,000 calls a
// month per API key, reset on the 1st in New York" as written, in a site:
// a key is told its 10,000 and when the month ends in New York; another
// key counts apart; and a key given a limit of 2 through the admin API
// is refused on its third call until that month's end.
func TestMonthlyQuotaRecipe(t *testing.T) {
	var recipe string
	for _, block := range docs.FencedBlocks(docs.Read(t, "../docs/examples.md"), "caddyfile") {
		if strings.Contains(block, "window month") {
			recipe = block
		}
	}
	if !strings.Contains(recipe, "zone monthly_calls {") || !strings.Contains(recipe, "timezone America/New_York") {
		t.Fatalf("docs/examples.md has no recipe for a month in New York:\n%s", recipe)
	}
	startCaddy(t, "\n"+siteAddr+" {\n"+recipe+"\n\trespond \"ok\"\n}\n")
	month := calendarPeriod{"month", "America/New_York"}
	call := func(key string) (*http.Response, time.Time) {
		t.Helper()
		var resp *http.Response
		_, end, _, _ := month.during(t, func() { resp, _ = do(t, http.MethodGet, siteURL+"/", "X-Api-Key: "+key) })
		return resp, end
	}
	for i, key := range []string{"customer-1", "customer-1", "customer-2"} {
		resp, end := call(key)
		status(t, resp, http.StatusOK)
		want := map[string]string{"X-Ratelimit-Limit": "10000", "X-Ratelimit-Reset": strconv.FormatInt(end.Unix(), 10)}
		want["X-Ratelimit-Remaining"] = map[int]string{0: "9999", 1: "9998", 2: "9999"}[i]
		for name, v := range want {
			if got := resp.Header.Get(name); got != v {
				t.Fatalf("call %d (%s): %s %s, want %s", i+1, key, name, got, v)
			}
		}
	}
	if code, body := adminJSON(t, adminURL, http.MethodPut, "/rate_limit/zones/monthly_calls/keys/customer-3/limit", `{"limit": 2}`); code != http.StatusOK {
		t.Fatalf("PUT an override: %d %s", code, body)
	}
	call("customer-3")
	call("customer-3")
	var resp *http.Response
	_, end, sent, got := month.during(t, func() { resp, _ = do(t, http.MethodGet, siteURL+"/", "X-Api-Key: customer-3") })
	status(t, resp, http.StatusTooManyRequests)
	if ra, err := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64); err != nil {
		t.Fatal(err)
	} else if least, most := seconds(end, sent, got); ra < least || ra > most {
		t.Fatalf("third call of a key with a limit of 2: Retry-After %d, want %d to %d seconds, until the month's end in New York (%s)", ra, least, most, end)
	}
}
