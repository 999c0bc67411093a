package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
)

// Window is a zone's window: a length, such as 1m or 24h, whose windows
// are cut on the Unix epoch, or a calendar period (day, week, month or
// year), which starts at local midnight in the zone's timezone: on a
// Monday for a week (ISO 8601), on the 1st for a month, on January 1st
// for a year. In JSON a length is a duration as Caddy reads one
// (nanoseconds, or a string such as "1m"), a calendar period its name.
type Window struct {
	Length time.Duration
	// Calendar is the calendar period, if the window is one (Length is
	// then 0).
	Calendar algorithms.CalendarPeriod
}

// String is the window as written: its length, or its period's name.
func (w Window) String() string {
	if w.Calendar != "" {
		return string(w.Calendar)
	}
	return w.Length.String()
}

// MarshalJSON writes a length as nanoseconds, as Caddy writes a
// caddy.Duration, and a calendar period as its name.
func (w Window) MarshalJSON() ([]byte, error) {
	if w.Calendar != "" {
		return json.Marshal(string(w.Calendar))
	}
	return json.Marshal(int64(w.Length))
}

// UnmarshalJSON reads a calendar period's name, or a duration.
func (w *Window) UnmarshalJSON(b []byte) error {
	var name string
	if json.Unmarshal(b, &name) == nil {
		if p := algorithms.CalendarPeriod(name); p.Valid() {
			*w = Window{Calendar: p}
			return nil
		}
	}
	var d caddy.Duration
	if err := d.UnmarshalJSON(b); err != nil {
		return fmt.Errorf("window: want a duration such as 1m or a calendar period (day, week, month or year), got %s", b)
	}
	*w = Window{Length: time.Duration(d)}
	return nil
}

// parseWindow reads a window as written in a Caddyfile.
func parseWindow(s string) (Window, error) {
	if p := algorithms.CalendarPeriod(s); p.Valid() {
		return Window{Calendar: p}, nil
	}
	d, err := caddy.ParseDuration(s)
	if err != nil {
		return Window{}, fmt.Errorf("want a duration such as 500ms or 1m, or a calendar period (day, week, month or year), got %q", s)
	}
	if err := checkWindow(d); err != nil {
		return Window{}, err
	}
	return Window{Length: d}, nil
}

// checkCalendarWindow refuses a calendar period with an algorithm that
// does not count in windows: their arithmetic is of a rate (gcra), of a
// window's equal sub-windows (sliding_window) or of units in flight
// (concurrency).
func checkCalendarWindow(w Window, alg algorithms.Algorithm) error {
	if w.Calendar != "" && !alg.Windowed() {
		return fmt.Errorf("a calendar period is only for algorithm fixed_window or sliding_tail (want one of those, or a duration with algorithm %s), got %s with algorithm %s", alg, w.Calendar, alg)
	}
	return nil
}

// checkTimezone refuses a time zone that is not an IANA name the
// built-in time zone database knows. Local is refused too: it is
// whatever the machine is set to, and instances that share a store
// must cut the same periods.
func checkTimezone(name string) (*time.Location, error) {
	if name == "" || strings.EqualFold(name, "Local") {
		return nil, fmt.Errorf("want an IANA time zone name such as America/New_York or UTC, got %q", name)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("want an IANA time zone name such as America/New_York or UTC, got %q", name)
	}
	return loc, nil
}

// errTimezoneWithoutCalendar refuses a timezone for a window of a
// length: such windows are cut on the Unix epoch, the same instants in
// every time zone, so a timezone would say nothing.
var errTimezoneWithoutCalendar = errors.New("only for a calendar window (day, week, month or year), which starts at local midnight; a window of a length is cut on the Unix epoch, the same in every time zone")
