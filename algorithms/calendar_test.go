package algorithms_test

import (
	"sync"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
	"github.com/d61b427a/caddy-rate-limit/internal/race"
)

func mustZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// TestCalendarPeriods checks periods against what the time zones' rules
// say, written out by hand as UTC instants: local midnight through DST
// changes (days of 23, 25 and, where the clock moves 2 hours, 22 hours),
// midnights that do not exist (the period starts at the first instant of
// its date), months of 28 to 31 days and ISO weeks from Monday.
func TestCalendarPeriods(t *testing.T) {
	for _, c := range []struct {
		period     algorithms.CalendarPeriod
		zone       string
		at         string
		start, end string
	}{
		{algorithms.Month, "UTC", "2024-02-15T12:00:00Z", "2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z"},
		{algorithms.Month, "UTC", "2023-02-28T23:59:59Z", "2023-02-01T00:00:00Z", "2023-03-01T00:00:00Z"},
		{algorithms.Month, "UTC", "2024-01-31T23:59:59Z", "2024-01-01T00:00:00Z", "2024-02-01T00:00:00Z"},
		{algorithms.Month, "UTC", "2024-04-01T00:00:00Z", "2024-04-01T00:00:00Z", "2024-05-01T00:00:00Z"},
		// March in New York loses the hour DST takes.
		{algorithms.Month, "America/New_York", "2024-03-15T12:00:00Z", "2024-03-01T05:00:00Z", "2024-04-01T04:00:00Z"},
		// Still January in New York, February in UTC.
		{algorithms.Month, "America/New_York", "2024-02-01T04:59:59Z", "2024-01-01T05:00:00Z", "2024-02-01T05:00:00Z"},
		{algorithms.Day, "America/New_York", "2024-03-10T12:00:00Z", "2024-03-10T05:00:00Z", "2024-03-11T04:00:00Z"},
		{algorithms.Day, "America/New_York", "2024-11-03T12:00:00Z", "2024-11-03T04:00:00Z", "2024-11-04T05:00:00Z"},
		// Santiago moves its clock at midnight: on 2024-09-08 from 00:00
		// to 01:00, so the day starts at 01:00 -03; on 2024-04-07 from
		// 00:00 back to 23:00 of the day before, which lasts 25 hours.
		{algorithms.Day, "America/Santiago", "2024-09-08T12:00:00Z", "2024-09-08T04:00:00Z", "2024-09-09T03:00:00Z"},
		{algorithms.Day, "America/Santiago", "2024-09-08T04:00:00Z", "2024-09-08T04:00:00Z", "2024-09-09T03:00:00Z"},
		{algorithms.Day, "America/Santiago", "2024-09-08T03:59:59.999Z", "2024-09-07T04:00:00Z", "2024-09-08T04:00:00Z"},
		{algorithms.Day, "America/Santiago", "2024-04-07T03:30:00Z", "2024-04-06T03:00:00Z", "2024-04-07T04:00:00Z"},
		{algorithms.Week, "America/Santiago", "2024-09-10T12:00:00Z", "2024-09-09T03:00:00Z", "2024-09-16T03:00:00Z"},
		// Havana too: 2024-03-10 starts at 01:00 CDT.
		{algorithms.Day, "America/Havana", "2024-03-10T12:00:00Z", "2024-03-10T05:00:00Z", "2024-03-11T04:00:00Z"},
		{algorithms.Day, "America/Havana", "2024-11-03T12:00:00Z", "2024-11-03T04:00:00Z", "2024-11-04T05:00:00Z"},
		{algorithms.Month, "America/Havana", "2024-03-20T00:00:00Z", "2024-03-01T05:00:00Z", "2024-04-01T04:00:00Z"},
		// Asuncion's October 2023 began at 01:00 -03: there was no
		// midnight on the 1st.
		{algorithms.Month, "America/Asuncion", "2023-10-15T00:00:00Z", "2023-10-01T04:00:00Z", "2023-11-01T03:00:00Z"},
		// Troll moves its clock 2 hours: a day of 22 hours.
		{algorithms.Day, "Antarctica/Troll", "2024-03-31T12:00:00Z", "2024-03-31T00:00:00Z", "2024-03-31T22:00:00Z"},
		// ISO weeks start on Monday: 2024-01-01 was one, 2026-01-01 a Thursday.
		{algorithms.Week, "UTC", "2024-01-03T00:00:00Z", "2024-01-01T00:00:00Z", "2024-01-08T00:00:00Z"},
		{algorithms.Week, "UTC", "2026-01-01T00:00:00Z", "2025-12-29T00:00:00Z", "2026-01-05T00:00:00Z"},
		{algorithms.Week, "UTC", "2024-01-07T23:59:59Z", "2024-01-01T00:00:00Z", "2024-01-08T00:00:00Z"},
		{algorithms.Year, "America/New_York", "2025-06-01T00:00:00Z", "2025-01-01T05:00:00Z", "2026-01-01T05:00:00Z"},
		{algorithms.Year, "UTC", "2024-12-31T23:59:59Z", "2024-01-01T00:00:00Z", "2025-01-01T00:00:00Z"},
		{algorithms.Year, "Asia/Tokyo", "2024-12-31T15:00:00Z", "2024-12-31T15:00:00Z", "2025-12-31T15:00:00Z"},
	} {
		cal := algorithms.CalendarOf(c.period, mustZone(t, c.zone))
		got := cal.At(utc(c.at).UnixMilli())
		if got.Start != utc(c.start).UnixMilli() || got.End != utc(c.end).UnixMilli() {
			t.Errorf("%s in %s at %s: [%s, %s), want [%s, %s)", c.period, c.zone, c.at,
				time.UnixMilli(got.Start).UTC().Format(time.RFC3339), time.UnixMilli(got.End).UTC().Format(time.RFC3339), c.start, c.end)
			continue
		}
		if of := cal.Of(got.Index); of != got {
			t.Errorf("%s in %s at %s: period %d is %+v, want %+v", c.period, c.zone, c.at, got.Index, of, got)
		}
	}
}

// TestCalendarIndexes: a period's index counts its periods since 1970
// in the zone's calendar: days, ISO weeks (the first from Monday
// 1969-12-29), months and years.
func TestCalendarIndexes(t *testing.T) {
	for _, c := range []struct {
		period algorithms.CalendarPeriod
		zone   string
		at     string
		index  int64
	}{
		{algorithms.Day, "UTC", "1970-01-01T00:00:00Z", 0},
		{algorithms.Day, "UTC", "2024-01-01T00:00:00Z", 19723},
		// Still 2023-12-31 in New York.
		{algorithms.Day, "America/New_York", "2024-01-01T04:00:00Z", 19722},
		{algorithms.Week, "UTC", "1970-01-01T00:00:00Z", 0},
		{algorithms.Week, "UTC", "1970-01-05T00:00:00Z", 1},
		{algorithms.Week, "UTC", "2024-01-01T00:00:00Z", 2818},
		{algorithms.Month, "UTC", "2024-01-01T00:00:00Z", 648},
		{algorithms.Month, "America/New_York", "2024-03-01T04:00:00Z", 649},
		{algorithms.Year, "UTC", "2024-07-01T00:00:00Z", 54},
	} {
		if got := algorithms.CalendarOf(c.period, mustZone(t, c.zone)).At(utc(c.at).UnixMilli()).Index; got != c.index {
			t.Errorf("%s in %s at %s: index %d, want %d", c.period, c.zone, c.at, got, c.index)
		}
	}
}

// TestCalendarEveryBoundary walks every period of 2024 to 2030 in zones
// whose clocks move at midnight, by 2 hours and by 30 minutes: each
// starts where the one before ends, at the first instant of its first
// date (the instant before is on an earlier date), and lasts as long as
// its dates do, give or take the clock's moves.
func TestCalendarEveryBoundary(t *testing.T) {
	nominal := map[algorithms.CalendarPeriod][2]time.Duration{
		algorithms.Day:   {24 * time.Hour, 24 * time.Hour},
		algorithms.Week:  {7 * 24 * time.Hour, 7 * 24 * time.Hour},
		algorithms.Month: {28 * 24 * time.Hour, 31 * 24 * time.Hour},
		algorithms.Year:  {365 * 24 * time.Hour, 366 * 24 * time.Hour},
	}
	for _, zone := range []string{"UTC", "America/New_York", "America/Santiago", "America/Havana", "America/Asuncion", "Antarctica/Troll", "Australia/Lord_Howe", "Pacific/Chatham"} {
		loc := mustZone(t, zone)
		for _, period := range []algorithms.CalendarPeriod{algorithms.Day, algorithms.Week, algorithms.Month, algorithms.Year} {
			cal := algorithms.CalendarOf(period, loc)
			end := utc("2031-01-01T00:00:00Z").UnixMilli()
			p := cal.At(utc("2024-01-01T00:00:00Z").UnixMilli())
			date := time.UnixMilli(p.Start).In(loc)
			date = time.Date(date.Year(), date.Month(), date.Day(), 0, 0, 0, 0, time.UTC)
			for p.Start < end {
				next := cal.At(p.End)
				if next.Index != p.Index+1 || next.Start != p.End || cal.At(p.End-1) != p || cal.Of(p.Index) != p {
					t.Fatalf("%s in %s: period %+v is followed by %+v", period, zone, p, next)
				}
				first := time.UnixMilli(p.Start).In(loc)
				if y, m, d := first.Date(); time.Date(y, m, d, 0, 0, 0, 0, time.UTC) != date {
					t.Fatalf("%s in %s: period starts at %s, want on %s", period, zone, first, date.Format(time.DateOnly))
				}
				if before := time.UnixMilli(p.Start - 1).In(loc); !dateBefore(before, date) {
					t.Fatalf("%s in %s: the instant before the period from %s is %s, on its date", period, zone, first, before)
				}
				length := time.Duration(p.End-p.Start) * time.Millisecond
				if n := nominal[period]; length < n[0]-2*time.Hour || length > n[1]+2*time.Hour {
					t.Fatalf("%s in %s from %s: %s long", period, zone, first, length)
				}
				switch period {
				case algorithms.Day:
					date = date.AddDate(0, 0, 1)
				case algorithms.Week:
					if first.Weekday() != time.Monday {
						t.Fatalf("week in %s starts on %s", zone, first)
					}
					date = date.AddDate(0, 0, 7)
				case algorithms.Month:
					date = date.AddDate(0, 1, 0)
				case algorithms.Year:
					date = date.AddDate(1, 0, 0)
				}
				p = next
			}
		}
	}
}

// dateBefore reports whether t's date is before date, a date at
// midnight UTC.
func dateBefore(t time.Time, date time.Time) bool {
	y, m, d := t.Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Before(date)
}

// TestCalendarIsShared: a calendar is one per period and zone, so its
// cache serves every zone and config that uses it.
func TestCalendarIsShared(t *testing.T) {
	ny := mustZone(t, "America/New_York")
	if algorithms.CalendarOf(algorithms.Month, ny) != algorithms.CalendarOf(algorithms.Month, mustZone(t, "America/New_York")) {
		t.Fatal("two calendars for a month in New York")
	}
	if algorithms.CalendarOf(algorithms.Month, ny) == algorithms.CalendarOf(algorithms.Day, ny) {
		t.Fatal("one calendar for a month and a day")
	}
}

// TestCalendarLookupsDoNotAllocate: the periods around the current one
// are computed when the clock enters it, and read from then on without
// allocating, as a request reads them.
func TestCalendarLookupsDoNotAllocate(t *testing.T) {
	if race.Enabled {
		t.Skip("allocations are not counted under the race detector")
	}
	cal := algorithms.CalendarOf(algorithms.Month, mustZone(t, "Europe/Paris"))
	now := vectors.Start.UnixMilli()
	cal.At(now)
	if n := testing.AllocsPerRun(100, func() {
		cal.At(now)
		cal.Of(cal.At(now).Index + 1)
		cal.Around(now)
	}); n != 0 {
		t.Fatalf("%v allocations a period lookup, want 0", n)
	}
}

// TestCalendarAround: the periods a Redis script chooses from are the
// one holding the instant, the one before and the three after, with the
// start of the one after those, so that a script whose clock is a
// period off still finds its period, the next one's end and the one
// after.
func TestCalendarAround(t *testing.T) {
	cal := algorithms.CalendarOf(algorithms.Day, mustZone(t, "America/Santiago"))
	at := utc("2024-09-08T12:00:00Z").UnixMilli()
	first, starts := cal.Around(at)
	want := []string{"2024-09-07T04:00:00Z", "2024-09-08T04:00:00Z", "2024-09-09T03:00:00Z", "2024-09-10T03:00:00Z", "2024-09-11T03:00:00Z", "2024-09-12T03:00:00Z"}
	if first != cal.At(at).Index-1 {
		t.Fatalf("first period %d, want %d", first, cal.At(at).Index-1)
	}
	for i, s := range want {
		if starts[i] != utc(s).UnixMilli() {
			t.Fatalf("start %d: %s, want %s", i, time.UnixMilli(starts[i]).UTC().Format(time.RFC3339), s)
		}
	}
}

// BenchmarkCalendarAt reads the period of an instant from the periods
// kept around the current one, and, for comparison, computes them anew
// for every read (instants half a year apart, by turns): what each
// request would pay without them.
func BenchmarkCalendarAt(b *testing.B) {
	cal := algorithms.CalendarOf(algorithms.Month, mustZone(b, "America/New_York"))
	now := vectors.Start.UnixMilli()
	b.Run("kept", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			cal.At(now)
		}
	})
	b.Run("computed", func(b *testing.B) {
		b.ReportAllocs()
		later := vectors.Start.AddDate(0, 6, 0).UnixMilli()
		for i := 0; b.Loop(); i++ {
			cal.At(now + int64(i%2)*(later-now))
		}
	})
}

// TestCalendarConcurrentLookups: goroutines asking one calendar about
// instants in different periods at once, moving the periods it keeps
// back and forth, each get the period that holds their instant.
func TestCalendarConcurrentLookups(t *testing.T) {
	cal := algorithms.CalendarOf(algorithms.Week, mustZone(t, "Europe/Berlin"))
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				at := start.Add(time.Duration((g*500+i)%200) * 37 * time.Hour).UnixMilli()
				p := cal.At(at)
				first, starts := cal.Around(at)
				if p.Start > at || at >= p.End || first != p.Index-1 || starts[1] != p.Start || starts[2] != p.End {
					t.Errorf("at %d: period %+v, around %d %v", at, p, first, starts)
					return
				}
			}
		})
	}
	wg.Wait()
}
