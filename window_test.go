package ratelimit

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// TestCalendarWindowAdapts: window month with a timezone adapts to a zone
// whose JSON names the period and the zone, which provisions with the
// calendar of that period in that zone; a window of a length is written
// as Caddy writes a duration, in nanoseconds, as before.
func TestCalendarWindowAdapts(t *testing.T) {
	handlers, err := adaptSite(t, "\trate_limit {\n\t\tzone monthly {\n\t\t\tkey {header.X-Api-Key}\n\t\t\tlimit 10000\n\t\t\twindow month\n\t\t\ttimezone America/New_York\n\t\t\talgorithm fixed_window\n\t\t}\n\t\tzone daily {\n\t\t\tlimit 5\n\t\t\twindow 24h\n\t\t}\n\t}")
	if err != nil {
		t.Fatal(err)
	}
	zones := handlers[0]["zones"].([]any)
	monthly, daily := zones[0].(map[string]any), zones[1].(map[string]any)
	if monthly["window"] != "month" || monthly["timezone"] != "America/New_York" {
		t.Fatalf("adapted zone %v, want window month in America/New_York", monthly)
	}
	if daily["window"] != float64(24*time.Hour) || daily["timezone"] != nil {
		t.Fatalf("adapted zone %v, want window 86400000000000 and no timezone", daily)
	}
	delete(handlers[0], "handler")
	config, err := json.Marshal(handlers[0])
	if err != nil {
		t.Fatal(err)
	}
	h := provisionHandler(t, string(config))
	m, d := h.Zones[0], h.Zones[1]
	if m.calendar == nil || m.calendar.Location().String() != "America/New_York" || m.calendar.Period() != "month" || m.period != 0 {
		t.Fatalf("zone monthly provisioned with calendar %v and period %s, want a month in America/New_York", m.calendar, m.period)
	}
	if d.calendar != nil || d.period != 24*time.Hour {
		t.Fatalf("zone daily provisioned with calendar %v and period %s, want windows of 24h", d.calendar, d.period)
	}
	// A month without a timezone is one in UTC.
	h = provisionHandler(t, `{"zones":[{"name":"utc_month","limit":[5],"window":"month"}]}`)
	if c := h.Zones[0].calendar; c == nil || c.Location() != time.UTC {
		t.Fatalf("calendar %v, want a month in UTC", c)
	}
}

// TestCalendarPeriodHeaders: a month in New York reports its real end,
// 00:00 on the 1st in New York, in X-RateLimit-Reset, in RateLimit's t
// and in Retry-After, and its own length in RateLimit-Policy's w: 31
// days for January, 28 for February, 31 days less the hour DST takes
// for March. At midnight the count starts afresh.
func TestCalendarPeriodHeaders(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	h := provisionHandler(t, `{"headers":"both","zones":[{"name":"unit_month","key":["k"],"limit":[2],"window":"month","timezone":"America/New_York","algorithm":"fixed_window"}]}`)
	february := time.Date(2026, 2, 1, 0, 0, 0, 0, ny)
	clock := withClock(t, h, february.Add(-10*time.Second))
	for i := range 2 {
		got := serve(t, h, context.Background(), http.MethodGet, "192.0.2.1")
		if got.status != http.StatusOK {
			t.Fatalf("request %d: %d", i+1, got.status)
		}
		assertHeader(t, got.header, "X-Ratelimit-Reset", strconv.FormatInt(february.Unix(), 10))
		assertHeader(t, got.header, "Ratelimit-Policy", `"unit_month";q=2;w=2678400`)
		assertHeader(t, got.header, "Ratelimit", `"unit_month";r=`+strconv.Itoa(1-i)+`;t=10`)
	}
	got := serve(t, h, context.Background(), http.MethodGet, "192.0.2.1")
	if got.status != http.StatusTooManyRequests {
		t.Fatalf("third request in January: %d, want 429", got.status)
	}
	assertHeader(t, got.header, "Retry-After", "10")
	clock.Set(february)
	got = serve(t, h, context.Background(), http.MethodGet, "192.0.2.1")
	if got.status != http.StatusOK {
		t.Fatalf("at midnight on February 1st in New York: %d, want the count afresh", got.status)
	}
	march := time.Date(2026, 3, 1, 0, 0, 0, 0, ny)
	assertHeader(t, got.header, "X-Ratelimit-Reset", strconv.FormatInt(march.Unix(), 10))
	assertHeader(t, got.header, "Ratelimit-Policy", `"unit_month";q=2;w=2419200`)
	assertHeader(t, got.header, "Ratelimit", `"unit_month";r=1;t=`+strconv.FormatInt(28*24*3600, 10))
	clock.Set(march.Add(time.Hour))
	got = serve(t, h, context.Background(), http.MethodGet, "192.0.2.1")
	assertHeader(t, got.header, "Ratelimit-Policy", `"unit_month";q=2;w=2674800`)
}

// TestCalendarSlidingTailRetryAfter: a sliding tail full on the last day
// of February (28 days) waits into March until the share of February's
// count has decayed over March's own length, 31 days less the hour DST
// takes in New York: a request of cost 2 against February's 2, with a
// limit of 2, until floor(2*(end-t)/length) is 0, past half of March.
func TestCalendarSlidingTailRetryAfter(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	h := provisionHandler(t, `{"zones":[{"name":"unit_tail_month","key":["k"],"limit":[2],"window":"month","timezone":"America/New_York","cost":{"POST":2}}]}`)
	march, april := time.Date(2026, 3, 1, 0, 0, 0, 0, ny), time.Date(2026, 4, 1, 0, 0, 0, 0, ny)
	now := march.Add(-time.Hour)
	withClock(t, h, now)
	serve(t, h, context.Background(), http.MethodGet, "192.0.2.1")
	serve(t, h, context.Background(), http.MethodGet, "192.0.2.1")
	got := serve(t, h, context.Background(), http.MethodPost, "192.0.2.1")
	if got.status != http.StatusTooManyRequests {
		t.Fatalf("third request: %d, want 429", got.status)
	}
	w := april.Sub(march).Milliseconds()
	retry := march.Add(time.Duration(w-(w-1)/2) * time.Millisecond)
	assertHeader(t, got.header, "Retry-After", strconv.FormatInt(retryAfterSeconds(retry, now), 10))
	if got := got.header.Get("Retry-After"); got != "1341001" {
		t.Fatalf("Retry-After %s, want 1341001: an hour to March, and half of its 2674800 s", got)
	}
}

// TestZoneWindowIndexFollowsTheCalendar: a calendar zone's first
// rejection of a key in a period (its rate_limit_exceeded event) is told
// by the period: instants of one month share an index, the next month
// has the next.
func TestZoneWindowIndexFollowsTheCalendar(t *testing.T) {
	h := provisionHandler(t, `{"zones":[{"name":"unit_month_events","limit":[2],"window":"month","algorithm":"fixed_window"}]}`)
	z := h.Zones[0]
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if a, b := z.windowIndex(start), z.windowIndex(start.Add(30*24*time.Hour)); a != b {
		t.Fatalf("January 1st and 31st have indexes %d and %d, want one", a, b)
	}
	if a, b := z.windowIndex(start), z.windowIndex(start.AddDate(0, 1, 0)); b != a+1 {
		t.Fatalf("January and February have indexes %d and %d, want consecutive ones", a, b)
	}
}

func assertHeader(t *testing.T, h http.Header, name, want string) {
	t.Helper()
	if got := h.Get(name); got != want {
		t.Fatalf("%s: %q, want %q", name, got, want)
	}
}
