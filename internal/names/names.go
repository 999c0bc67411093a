// Package names holds the rule for every name that a response, a metric
// label, a log line, a Redis key or an admin API path may show: the names
// of zones and of load shedders.
package names

import "fmt"

// MaxLen bounds a name's length in bytes.
const MaxLen = 128

// Check accepts a name of 1 to MaxLen printable ASCII characters (0x20 to
// 0x7E): any of them can be written in an RFC 8941 string, which the
// RateLimit and RateLimit-Policy headers carry a zone's name in, and none
// is a control character that could confuse a log line or a header. An
// empty name is the caller's to refuse, with what it needs instead.
func Check(name string) error {
	if len(name) > MaxLen {
		return fmt.Errorf("name: want at most %d characters, got %d", MaxLen, len(name))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("name: want printable ASCII characters (0x20 to 0x7E), got byte 0x%02x at offset %d", c, i)
		}
	}
	return nil
}
