package ratelimit

// The refused configurations and the check of their errors, shared with
// the integration tests (package ratelimit_test), which post them to a
// running Caddy's /load and to the built Caddy's command line.
var (
	BadCaddyfiles = badCaddyfiles
	BadSite       = badSite
	Expand        = expand
	AssertNames   = assertNames
)

// The documents' sections and code blocks, for the integration tests that
// run what a document shows.
var (
	DocSection   = docSection
	FencedBlocks = fencedBlocks
)

// HiddenKey is how this process shows a key that log_keys does not show.
var HiddenKey = hiddenKey

// TopKeysTracked counts the keys zone's top-keys summaries track now.
func TopKeysTracked(zone string) int {
	t := topKeysFor(zone)
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += int(s.current.n) + int(s.previous.n)
		s.mu.Unlock()
	}
	return n
}
