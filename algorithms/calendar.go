package algorithms

import (
	"sync"
	"sync/atomic"
	"time"

	// The time zones' rules, built in, so that a calendar period is
	// cut the same on a machine without /usr/share/zoneinfo (a scratch
	// container) as on any other.
	_ "time/tzdata"
)

// CalendarPeriod names a calendar period a window can be: a day, an ISO
// 8601 week (from Monday), a month or a year.
type CalendarPeriod string

// The calendar periods.
const (
	Day   CalendarPeriod = "day"
	Week  CalendarPeriod = "week"
	Month CalendarPeriod = "month"
	Year  CalendarPeriod = "year"
)

// Valid reports whether p names a calendar period.
func (p CalendarPeriod) Valid() bool {
	return p == Day || p == Week || p == Month || p == Year
}

// Span is one window of a rate: its index, and the instants it starts
// and ends, in ms since the epoch. It holds the instants from Start up
// to End, not End itself.
type Span struct {
	Index, Start, End int64
}

// Length is how long the window lasts, in ms.
func (s Span) Length() int64 { return s.End - s.Start }

// A Calendar cuts time into calendar periods of a time zone, the windows
// of a rate whose quota is sold by the calendar ("10,000 calls a month,
// reset on the 1st"). A period starts at local midnight of its first
// date (the 1st of a month, January 1st, a Monday); where the clock jumps
// over midnight (America/Santiago, America/Havana), at the first instant
// of that date. So periods are as long as the clock makes them: a day of
// 23 or 25 hours where DST begins or ends, a month of 28 to 31 days.
//
// A period's index counts the periods since 1970 in the zone's calendar
// (days since 1970-01-01, ISO weeks since the one of Monday 1969-12-29,
// months since January 1970, years since 1970), so that consecutive
// periods have consecutive indexes, as epoch windows do, and a day in
// UTC has the index of the epoch window of 24 hours it is.
//
// Finding a period's boundaries takes the zone's rules, far dearer than
// the division an epoch window takes, so a calendar keeps the periods
// around the last instant it was asked about and recomputes them only
// when asked about one outside them: about once a period. One calendar
// serves every zone and config with the same period and time zone
// (CalendarOf), so they share the work.
type Calendar struct {
	period CalendarPeriod
	loc    *time.Location
	// near holds the periods around the current one; see periodsNear.
	near atomic.Pointer[nearPeriods]
}

// nearPeriods are six consecutive periods' starts, from period first:
// the current one, first+1, the one before it and the four after. They
// tell the periods first to first+4, each with its end, which is the
// next one's start.
type nearPeriods struct {
	first  int64
	starts [6]int64
}

// calendars holds one Calendar per period and time zone name; there are
// no more of them than the configs loaded have named.
var calendars sync.Map

type calendarKey struct {
	period CalendarPeriod
	zone   string
}

// CalendarOf returns the calendar of period p in time zone loc, the same
// one for every caller.
func CalendarOf(p CalendarPeriod, loc *time.Location) *Calendar {
	k := calendarKey{p, loc.String()}
	if c, ok := calendars.Load(k); ok {
		return c.(*Calendar)
	}
	c, _ := calendars.LoadOrStore(k, &Calendar{period: p, loc: loc})
	return c.(*Calendar)
}

// Period is the calendar's period.
func (c *Calendar) Period() CalendarPeriod { return c.period }

// Location is the calendar's time zone.
func (c *Calendar) Location() *time.Location { return c.loc }

// At returns the period that holds the instant ms.
func (c *Calendar) At(ms int64) Span {
	n := c.near.Load()
	if n == nil || ms < n.starts[0] || ms >= n.starts[5] {
		n = c.around(ms)
		c.near.Store(n)
	}
	k := 4
	for k > 0 && n.starts[k] > ms {
		k--
	}
	return Span{Index: n.first + int64(k), Start: n.starts[k], End: n.starts[k+1]}
}

// Of returns period idx.
func (c *Calendar) Of(idx int64) Span {
	if n := c.near.Load(); n != nil && idx >= n.first && idx <= n.first+4 {
		k := idx - n.first
		return Span{Index: idx, Start: n.starts[k], End: n.starts[k+1]}
	}
	return Span{Index: idx, Start: c.start(idx), End: c.start(idx + 1)}
}

// Around returns the index of the period before the one that holds the
// instant ms, and the starts of that period and the five after it: the
// periods a clock less than a period away from ms may be in, each with
// its end, the next one's end, and the one after that (a count written
// by a clock that ran a period ahead). A Redis script, which knows no
// time zones, picks among them the period its own clock is in.
func (c *Calendar) Around(ms int64) (first int64, starts [6]int64) {
	n := c.near.Load()
	if n == nil || ms < n.starts[1] || ms >= n.starts[2] {
		n = c.around(ms)
		c.near.Store(n)
	}
	return n.first, n.starts
}

// around computes the periods around the one that holds ms.
func (c *Calendar) around(ms int64) *nearPeriods {
	y, m, d := time.UnixMilli(ms).In(c.loc).Date()
	idx := c.index(y, m, d)
	n := &nearPeriods{first: idx - 1}
	for k := range n.starts {
		n.starts[k] = c.start(n.first + int64(k))
	}
	// A clock set back across midnight shows the date before again, in
	// the period that began at the first midnight.
	for n.starts[2] <= ms {
		copy(n.starts[:], n.starts[1:])
		n.first++
		n.starts[5] = c.start(n.first + 5)
	}
	return n
}

// index returns the index of the period whose dates hold y-m-d.
func (c *Calendar) index(y int, m time.Month, d int) int64 {
	switch c.period {
	case Month:
		return int64(y-1970)*12 + int64(m-1)
	case Year:
		return int64(y - 1970)
	}
	days := floorDiv(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix(), 86400)
	if c.period == Week {
		// 1970-01-01 was a Thursday: its week began on Monday, 3 days
		// before.
		return floorDiv(days+3, 7)
	}
	return days
}

// firstDate returns the first date of period idx.
func (c *Calendar) firstDate(idx int64) (int, time.Month, int) {
	switch c.period {
	case Month:
		return 1970 + int(floorDiv(idx, 12)), time.Month(idx-12*floorDiv(idx, 12)) + 1, 1
	case Year:
		return 1970 + int(idx), time.January, 1
	case Week:
		idx = 7*idx - 3
	}
	return time.Unix(idx*86400, 0).UTC().Date()
}

// start returns when period idx starts, in ms: the first instant whose
// local date is its first date or later. Within one of the zone's
// offsets, local time runs with UTC, so the first such instant is
// midnight at that offset if that falls inside it, or else where the
// offset begins (the clock jumped past midnight). The search starts 30
// hours before midnight in UTC, before the date begins anywhere (no
// offset is 30 hours), and walks the zone's offsets from there.
func (c *Calendar) start(idx int64) int64 {
	y, m, d := c.firstDate(idx)
	midnight := time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix()
	t := midnight - 30*3600
	for {
		at := time.Unix(t, 0).In(c.loc)
		_, offset := at.Zone()
		_, end := at.ZoneBounds()
		first := max(t, midnight-int64(offset))
		if end.IsZero() || first < end.Unix() {
			return first * 1000
		}
		t = end.Unix()
	}
}

// floorDiv returns floor(a/b) for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
