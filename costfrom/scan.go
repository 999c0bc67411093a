package costfrom

import (
	"bytes"
	"encoding/binary"
)

// scanner reads JSON pushed to it in pieces of any size, as a response's
// body arrives, and keeps the few values this package reads in its record.
// It never holds a value's bytes: it follows the nesting of the values it
// may read from (maxDepth levels of objects, key by key), skips everything
// else by counting brackets and looking for quotes, and parses the numbers
// it reads as their digits come. Its memory is its own size, whatever the
// size of the JSON.
//
// It reads a sequence of JSON values (one document, newline-delimited JSON,
// or the data of a server-sent event): feed stops after each top-level
// value, so that the caller can read the record before the next begins.
//
// It checks JSON only as far as it reads it: what it skips is not
// validated, and a value that ends where the JSON stops making sense is
// still read. The values it reads come from a model server, not from a
// client trying to fool it (a request's body, whole before it is read, is
// read by Fields). It compares keys as Fields does (see keyByte), and of
// a count given twice in one object it keeps the larger: no server reads
// more tokens than it does.
type scanner struct {
	rec   record
	state state
	// depth is the number of objects and arrays open around the current
	// position, at most maxDepth; kinds and keys describe them, 1-based:
	// kinds[d] is '{' or '[', keys[d] the key of the member being read in
	// it (keyOther for an array's elements, and for a key not read).
	depth int
	kinds [maxDepth + 1]byte
	keys  [maxDepth + 1]key

	skip  int  // depth inside a skipped object or array
	open  byte // the bracket that opened the skipped value
	esc   bool // a backslash ended the last piece of a string
	isKey bool // the string being read is a key
	key   keyFolder

	num   int64 // the number being read
	numOK bool  // it is a non-negative integer (of more than maxDigits digits: maxCount)
	ndig  int

	lit  string // the literal being read ("true", "false", "null") and how
	litN int    // much of it was seen

	// model holds the string being read where a model's name is (see
	// modelAt), up to maxModel bytes; modelN is how many, or -1 once it
	// is none read (too long, or with an escape).
	model     [maxModel]byte
	modelN    int
	capturing bool

	member     int  // where the current member of the top-level object began: its comma, or its key if first
	firstKey   bool // the current member of the top-level object is its first
	keyStart   int  // where the current key began
	extendsCut bool // rec.cut ends at the next top-level key (a first member was cut)
}

// maxDepth is how deep the scanner follows objects: the deepest values
// read are response.usage.input_tokens_details.cached_tokens and
// message.usage.cache_creation.ephemeral_1h_input_tokens (Gemini's
// candidates[].finishReason is at 3).
const maxDepth = 4

// maxModel bounds the name of a model the scanner reads: a longer one is
// not read.
const maxModel = 256

// maxDigits bounds the digits of the numbers read, so that sums of them
// cannot overflow: a number of more digits is read as maxCount, the
// largest of maxDigits, so that a count too large to hold still counts
// as larger than any limit.
const (
	maxDigits = 18
	maxCount  = 999_999_999_999_999_999
)

type state uint8

const (
	stValue    state = iota // a value is expected
	stObjStart              // after '{': a key or '}'
	stArrStart              // after '[': a value or ']'
	stKey                   // after ',' in an object: a key
	stColon                 // after a key
	stAfter                 // after a value: ',' or the end of its container
	stString
	stNumber
	stLiteral
	stSkip
	stDone  // a top-level value ended; the next feed reads another
	stError // not JSON: nothing more is read until reset
)

// kind is the kind of a JSON value; kindNone is a value not seen.
type kind uint8

const (
	kindNone kind = iota
	kindObject
	kindArray
	kindString
	kindNumber
	kindTrue
	kindFalse
	kindNull
)

// key names the keys the scanner reads; keyOther is any other.
type key uint8

const (
	keyOther key = iota
	keyUsage
	keyMessage
	keyResponse
	keyChoices
	keyDone
	keyPromptEvalCount
	keyEvalCount
	keyPromptTokens
	keyCompletionTokens
	keyTotalTokens
	keyInputTokens
	keyOutputTokens
	keyCacheCreation
	keyCacheRead
	keyModel
	keyPromptTokensDetails
	keyInputTokensDetails
	keyCachedTokens
	keyCacheCreationDetails
	keyEphemeral1h
	// Google's Gemini API and Vertex AI: usageMetadata and its counts
	// (in this order, see geminiCounts), the candidates whose
	// finishReason, or the promptFeedback whose blockReason, tells the
	// last chunk of a response, and the modelVersion.
	keyUsageMetadata
	keyPromptTokenCount
	keyToolUsePromptTokenCount
	keyCandidatesTokenCount
	keyThoughtsTokenCount
	keyTotalTokenCount
	keyCachedContentTokenCount
	keyCandidates
	keyFinishReason
	keyPromptFeedback
	keyBlockReason
	keyModelVersion
)

// lookup returns the key whose folded form (see keyFolder) is b.
func lookup(b []byte) key {
	switch string(b) {
	case "usage":
		return keyUsage
	case "message":
		return keyMessage
	case "response":
		return keyResponse
	case "choices":
		return keyChoices
	case "done":
		return keyDone
	case "prompt_eval_count":
		return keyPromptEvalCount
	case "eval_count":
		return keyEvalCount
	case "prompt_tokens":
		return keyPromptTokens
	case "completion_tokens":
		return keyCompletionTokens
	case "total_tokens":
		return keyTotalTokens
	case "input_tokens":
		return keyInputTokens
	case "output_tokens":
		return keyOutputTokens
	case "cache_creation_input_tokens":
		return keyCacheCreation
	case "cache_read_input_tokens":
		return keyCacheRead
	case "model":
		return keyModel
	case "prompt_tokens_details":
		return keyPromptTokensDetails
	case "input_tokens_details":
		return keyInputTokensDetails
	case "cached_tokens":
		return keyCachedTokens
	case "cache_creation":
		return keyCacheCreationDetails
	case "ephemeral_1h_input_tokens":
		return keyEphemeral1h
	// Gemini's keys, under their JSON names and under their protocol
	// buffer names, which Google's servers read and some write.
	case "usagemetadata", "usage_metadata":
		return keyUsageMetadata
	case "prompttokencount", "prompt_token_count":
		return keyPromptTokenCount
	case "tooluseprompttokencount", "tool_use_prompt_token_count":
		return keyToolUsePromptTokenCount
	case "candidatestokencount", "candidates_token_count":
		return keyCandidatesTokenCount
	case "thoughtstokencount", "thoughts_token_count":
		return keyThoughtsTokenCount
	case "totaltokencount", "total_token_count":
		return keyTotalTokenCount
	case "cachedcontenttokencount", "cached_content_token_count":
		return keyCachedContentTokenCount
	case "candidates":
		return keyCandidates
	case "finishreason", "finish_reason":
		return keyFinishReason
	case "promptfeedback", "prompt_feedback":
		return keyPromptFeedback
	case "blockreason", "block_reason":
		return keyBlockReason
	case "modelversion", "model_version":
		return keyModelVersion
	}
	return keyOther
}

// record is what the scanner read of the current top-level value. For a
// key given twice, the last one counts, as in encoding/json, but for the
// counts, of which the larger counts, and done, true if either is.
type record struct {
	top kind // the kind of the top-level value, as soon as it begins

	// Response.
	usage         kind   // top-level usage
	final         counts // usage, or response.usage: a response's whole usage
	partial       counts // message.usage: Anthropic's usage so far
	ollama        counts // top-level prompt_eval_count and eval_count
	done          bool   // top-level "done": true
	choices       kind
	choicesFilled bool // choices has an element
	// cutA, cutB bound a top-level "usage": null member with the comma or
	// space that separates it from its neighbour; cutA == cutB if none.
	cutA, cutB int
	// gemini is the top-level usageMetadata of Gemini's responses; ends
	// tells a value that is the last of a response: a candidate's
	// finishReason, or the prompt's blockReason, is given.
	gemini geminiCounts
	ends   bool
	// opened are the objects on the paths to the cached tokens the value
	// opened (see containerBit); hasModel tells that the scanner's model
	// holds the name of the model the value names last.
	opened   uint8
	hasModel bool
}

// counts are the token counts of a usage, with which of them were given.
// cached are OpenAI's cached tokens, part of in; write1h Anthropic's
// 1-hour cache writes, part of cacheCreate. A server that reads a cached
// count one way and another server another way would price the prompt
// differently, and a discount read too large undercharges: so a cached
// count given twice, or in an object given twice (a server reads the
// last), is ambiguous, and counts as none.
type counts struct {
	in, out, total, cacheCreate, cacheRead int64
	cached, write1h                        int64
	has                                    uint8
	ambiguous                              bool
}

const (
	hasIn uint8 = 1 << iota
	hasOut
	hasTotal
	hasCacheCreate
	hasCacheRead
	hasCached
	hasWrite1h
)

// geminiCounts are the counts of Gemini's usageMetadata, by key from
// keyPromptTokenCount on, with a bit in has for each given. Gemini, as
// protocol buffers do, leaves out a count of 0. Its counts are totals
// so far in each chunk of a stream.
type geminiCounts struct {
	n         [keyCachedContentTokenCount - keyPromptTokenCount + 1]int64
	has       uint8
	ambiguous bool // the cached count was given twice (see counts)
}

// set records the count n under the key k, if k is one of Gemini's
// counts, unless a larger count is recorded under it already.
func (g *geminiCounts) set(k key, n int64) {
	if k < keyPromptTokenCount || k > keyCachedContentTokenCount {
		return
	}
	i := k - keyPromptTokenCount
	if k == keyCachedContentTokenCount && g.has&(1<<i) != 0 {
		g.ambiguous = true
	}
	g.n[i], g.has = max(g.n[i], n), g.has|1<<i
}

// counts returns Gemini's counts as the other formats' are: input is the
// prompt's tokens (its cached content's among them, as cached) and the
// tool-use prompt's; output the candidates' and the thoughts', which
// are billed as output; total the totalTokenCount, or input and output.
// A count left out is 0.
func (g *geminiCounts) counts() counts {
	at := func(k key) int64 { return g.n[k-keyPromptTokenCount] }
	c := counts{
		in:     at(keyPromptTokenCount) + at(keyToolUsePromptTokenCount),
		out:    at(keyCandidatesTokenCount) + at(keyThoughtsTokenCount),
		total:  at(keyTotalTokenCount),
		cached: at(keyCachedContentTokenCount),
		has:    hasIn | hasOut | hasTotal | hasCached, ambiguous: g.ambiguous,
	}
	if g.has&(1<<(keyTotalTokenCount-keyPromptTokenCount)) == 0 {
		c.total = c.in + c.out
	}
	return c
}

// set records the count n under the key k, unless a larger count is
// recorded under it already.
func (c *counts) set(k key, n int64) {
	switch k {
	case keyPromptTokens, keyInputTokens, keyPromptEvalCount:
		c.in, c.has = max(c.in, n), c.has|hasIn
	case keyCompletionTokens, keyOutputTokens, keyEvalCount:
		c.out, c.has = max(c.out, n), c.has|hasOut
	case keyTotalTokens:
		c.total, c.has = max(c.total, n), c.has|hasTotal
	case keyCacheCreation:
		c.cacheCreate, c.has = max(c.cacheCreate, n), c.has|hasCacheCreate
	case keyCacheRead:
		c.cacheRead, c.has = max(c.cacheRead, n), c.has|hasCacheRead
	}
}

// union takes, of each count, the larger of c's and o's.
func (c *counts) union(o counts) {
	c.in, c.out, c.total = max(c.in, o.in), max(c.out, o.out), max(c.total, o.total)
	c.cacheCreate, c.cacheRead = max(c.cacheCreate, o.cacheCreate), max(c.cacheRead, o.cacheRead)
	c.cached, c.write1h = max(c.cached, o.cached), max(c.write1h, o.write1h)
	c.ambiguous = c.ambiguous || o.ambiguous || c.has&o.has&hasCached != 0
	c.has |= o.has
}

// merge takes the counts o gives over c's.
func (c *counts) merge(o counts) {
	if o.has&hasIn != 0 {
		c.in = o.in
	}
	if o.has&hasOut != 0 {
		c.out = o.out
	}
	if o.has&hasTotal != 0 {
		c.total = o.total
	}
	if o.has&hasCacheCreate != 0 {
		c.cacheCreate = o.cacheCreate
	}
	if o.has&hasCacheRead != 0 {
		c.cacheRead = o.cacheRead
	}
	if o.has&hasCached != 0 {
		c.cached, c.ambiguous = o.cached, o.ambiguous
	}
	if o.has&hasWrite1h != 0 {
		c.write1h = o.write1h
	}
	c.has |= o.has
}

// reset forgets the value being read, to read a new one.
func (s *scanner) reset() {
	*s = scanner{}
}

// next prepares the scanner for the top-level value after the one that
// ended.
func (s *scanner) next() {
	s.rec = record{}
	s.state, s.extendsCut = stValue, false
}

// between reports whether the scanner is between two top-level values.
func (s *scanner) between() bool {
	return s.state == stDone || s.state == stValue && s.depth == 0
}

// feed reads p, whose first byte is at position base (positions are what
// the record's cutA and cutB hold). It stops after a top-level value ends and then
// returns how much of p it read and true: the record holds that value
// until the next call. Each state reads on from i and says where, and
// whether feed goes on, wants more bytes, or stops at a value's end.
func (s *scanner) feed(p []byte, base int) (int, bool) {
	if s.state == stDone {
		s.next()
	}
	i := 0
	for i < len(p) {
		var st step
		switch s.state {
		case stError:
			return len(p), false
		case stString:
			i, st = s.readString(p, i, base)
		case stSkip:
			i, st = s.skipValue(p, i, base)
		case stNumber:
			i, st = s.readNumber(p, i, base)
		case stLiteral:
			i, st = s.readLiteral(p, i, base)
		default:
			i, st = s.readBetween(p, i, base)
		}
		switch st {
		case wantMore:
			return len(p), false
		case valueEnded:
			return i, true
		}
	}
	return i, false
}

// step is what a state of feed asks for once it has read: to read on,
// more bytes (all of p is read), or to stop where a top-level value
// ended.
type step uint8

const (
	readOn step = iota
	wantMore
	valueEnded
)

// readString reads a string from p[i:], a key or a value, keeping the
// keys and the model it is asked to.
func (s *scanner) readString(p []byte, i, base int) (int, step) {
	n := s.stringEnd(p[i:])
	if s.isKey && s.skip == 0 {
		s.keepKey(p[i:], n)
	} else if s.capturing {
		s.keepModel(p[i:], n)
	}
	if n < 0 {
		return i, wantMore
	}
	i += n
	switch {
	case s.skip > 0:
		s.state = stSkip
	case s.isKey:
		s.keys[s.depth] = lookup(s.key.key())
		s.state = stColon
	default:
		if s.end(kindString, base+i) {
			return i, valueEnded
		}
	}
	return i, readOn
}

// skipValue skips a value no key asks for: the bytes between strings,
// one at a time, and the strings whole, without going back to feed.
func (s *scanner) skipValue(p []byte, i, base int) (int, step) {
	for i < len(p) {
		c := p[i]
		i++
		switch c {
		case '"':
			n := s.stringEnd(p[i:])
			if n < 0 {
				s.state = stString
				return i, wantMore
			}
			i += n
		case '{', '[':
			s.skip++
		case '}', ']':
			s.skip--
			if s.skip > 0 {
				continue
			}
			k := kindObject
			if s.open == '[' {
				k = kindArray
			}
			if s.end(k, base+i) {
				return i, valueEnded
			}
			return i, readOn
		}
	}
	return i, readOn
}

// readNumber reads a number's digits from p[i:]; a fraction or an
// exponent makes it no count.
func (s *scanner) readNumber(p []byte, i, base int) (int, step) {
	for ; i < len(p) && p[i] >= '0' && p[i] <= '9'; i++ {
		if s.ndig++; s.ndig <= maxDigits {
			s.num = s.num*10 + int64(p[i]-'0')
		}
	}
	if i == len(p) {
		return i, readOn
	}
	if c := p[i]; c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' {
		s.numOK = false
		return i + 1, readOn
	}
	// The byte after the number is read again, as what follows
	// a value.
	if s.ndig > maxDigits {
		s.num = maxCount
	}
	if s.end(kindNumber, base+i) {
		return i, valueEnded
	}
	return i, readOn
}

// readLiteral reads the next byte of true, false or null.
func (s *scanner) readLiteral(p []byte, i, base int) (int, step) {
	if p[i] != s.lit[s.litN] {
		s.state = stError
		return i, readOn
	}
	i++
	s.litN++
	if s.litN == len(s.lit) {
		k := kindNull
		switch s.lit {
		case "true":
			k = kindTrue
		case "false":
			k = kindFalse
		}
		if s.end(k, base+i) {
			return i, valueEnded
		}
	}
	return i, readOn
}

// readBetween reads the white space and the structural byte between
// values (structural).
func (s *scanner) readBetween(p []byte, i, base int) (int, step) {
	c := p[i]
	if c == ' ' || c == '\n' || c == '\r' || c == '\t' {
		return i + 1, readOn
	}
	if s.structural(c, base+i) {
		return i + 1, valueEnded
	}
	if s.state != stNumber {
		// A number's first byte is read again as a digit.
		i++
	}
	return i, readOn
}

// structural reads c, at position pos, in one of the states between
// values. It reports whether a top-level value ended with it.
func (s *scanner) structural(c byte, pos int) bool {
	switch s.state {
	case stValue:
		s.begin(c)
	case stArrStart:
		if c == ']' {
			return s.close(c, pos)
		}
		s.begin(c)
	case stObjStart, stKey:
		switch {
		case c == '"':
			s.isKey, s.keyStart = true, pos
			s.key.reset()
			if s.depth == 1 {
				if s.state == stObjStart {
					s.member, s.firstKey = pos, true
				}
				if s.extendsCut {
					s.rec.cutB, s.extendsCut = pos, false
				}
			}
			s.state = stString
		case c == '}' && s.state == stObjStart:
			return s.close(c, pos)
		default:
			s.state = stError
		}
	case stColon:
		if c != ':' {
			s.state = stError
			return false
		}
		s.state = stValue
	case stAfter:
		switch c {
		case ',':
			if s.kinds[s.depth] == '[' {
				s.state = stValue
				return false
			}
			if s.depth == 1 {
				s.member, s.firstKey = pos, false
			}
			s.state = stKey
		case '}', ']':
			return s.close(c, pos)
		default:
			s.state = stError
		}
	}
	return false
}

// begin starts reading the value whose first byte is c.
func (s *scanner) begin(c byte) {
	d := s.depth
	if d == 0 {
		s.rec.top = kindOf(c)
	} else if s.kinds[d] == '[' {
		// An array's elements are skipped; only whether choices has one
		// is read.
		s.keys[d] = keyOther
		switch {
		case d == 2 && s.keys[1] == keyChoices:
			s.rec.choicesFilled = true
		case d == 2 && s.keys[1] == keyCandidates:
			// Gemini's candidates are read, for their finishReason.
			s.keys[d] = keyCandidates
		}
	}
	read := d == 0 || s.keys[d] != keyOther
	switch c {
	case '{', '[':
		if !read || d == maxDepth {
			s.skip, s.open, s.state = 1, c, stSkip
			return
		}
		if bit := s.containerBit(); c == '{' && bit != 0 {
			if s.rec.opened&bit != 0 {
				s.rec.final.ambiguous, s.rec.partial.ambiguous = true, true
			}
			s.rec.opened |= bit
		}
		d++
		s.depth, s.kinds[d], s.keys[d] = d, c, keyOther
		s.state = stObjStart
		if c == '[' {
			s.state = stArrStart
		}
	case '"':
		s.isKey, s.state = false, stString
		if s.capturing = s.modelAt(); s.capturing {
			s.modelN = 0
		}
	case 't':
		s.lit, s.litN, s.state = "true", 1, stLiteral
	case 'f':
		s.lit, s.litN, s.state = "false", 1, stLiteral
	case 'n':
		s.lit, s.litN, s.state = "null", 1, stLiteral
	default:
		if c == '-' || c >= '0' && c <= '9' {
			s.num, s.ndig, s.numOK, s.state = 0, 0, true, stNumber
			return
		}
		s.state = stError
	}
}

func kindOf(c byte) kind {
	switch c {
	case '{':
		return kindObject
	case '[':
		return kindArray
	case '"':
		return kindString
	case 't':
		return kindTrue
	case 'f':
		return kindFalse
	case 'n':
		return kindNull
	}
	return kindNumber
}

// close ends the object or array that c, at pos, closes.
func (s *scanner) close(c byte, pos int) bool {
	d := s.depth
	if c == '}' && s.kinds[d] != '{' || c == ']' && s.kinds[d] != '[' {
		s.state = stError
		return false
	}
	s.depth = d - 1
	k := kindObject
	if c == ']' {
		k = kindArray
	}
	return s.end(k, pos+1)
}

// end records the value of kind k that ends at end and reports whether
// it was the top-level value.
func (s *scanner) end(k kind, end int) bool {
	s.value(k, end)
	if s.depth == 0 {
		s.state = stDone
		return true
	}
	s.state = stAfter
	return false
}

// value records a value that ended, if it is one of those read.
func (s *scanner) value(k kind, end int) {
	r := &s.rec
	n, isCount := s.num, k == kindNumber && s.numOK
	switch s.depth {
	case 1:
		switch s.keys[1] {
		case keyModel, keyModelVersion:
			s.endModel(k)
		case keyUsage:
			r.usage = k
			if k == kindNull {
				r.cutA, r.cutB, s.extendsCut = s.member, end, false
				if s.firstKey {
					// The first member goes with the comma after it: the
					// cut ends at the next key, if there is one.
					r.cutA, s.extendsCut = s.keyStart, true
				}
			}
		case keyChoices:
			r.choices = k
		case keyDone:
			r.done = r.done || k == kindTrue
		case keyPromptEvalCount, keyEvalCount:
			if isCount {
				r.ollama.set(s.keys[1], n)
			}
		}
	case 2:
		switch {
		case s.keys[1] == keyUsage && isCount:
			r.final.set(s.keys[2], n)
		case s.keys[1] == keyUsageMetadata && isCount:
			r.gemini.set(s.keys[2], n)
		case s.keys[1] == keyPromptFeedback && s.keys[2] == keyBlockReason:
			r.ends = r.ends || k != kindNull
		case s.keys[2] == keyModel && (s.keys[1] == keyMessage || s.keys[1] == keyResponse):
			s.endModel(k)
		}
	case 3:
		switch {
		case s.keys[1] == keyCandidates && s.keys[3] == keyFinishReason:
			r.ends = r.ends || k != kindNull
		case !isCount:
		case s.keys[1] == keyUsage:
			r.final.setDetail(s.keys[2], s.keys[3], n)
		case s.keys[2] != keyUsage:
		case s.keys[1] == keyMessage:
			r.partial.set(s.keys[3], n)
		case s.keys[1] == keyResponse:
			r.final.set(s.keys[3], n)
		}
	case 4:
		switch {
		case !isCount || s.keys[2] != keyUsage:
		case s.keys[1] == keyMessage:
			r.partial.setDetail(s.keys[3], s.keys[4], n)
		case s.keys[1] == keyResponse:
			r.final.setDetail(s.keys[3], s.keys[4], n)
		}
	}
}

// setDetail records the count n under the key k of the object under the
// key of a usage in: the cached tokens of OpenAI's prompt_tokens_details
// (Chat Completions) and input_tokens_details (the Responses API), and
// the 1-hour writes of Anthropic's cache_creation.
func (c *counts) setDetail(in, k key, n int64) {
	switch {
	case k == keyCachedTokens && (in == keyPromptTokensDetails || in == keyInputTokensDetails):
		c.ambiguous = c.ambiguous || c.has&hasCached != 0
		c.cached, c.has = max(c.cached, n), c.has|hasCached
	case k == keyEphemeral1h && in == keyCacheCreationDetails:
		c.write1h, c.has = max(c.write1h, n), c.has|hasWrite1h
	}
}

// containerBit returns the bit of rec.opened that stands for the object
// the value about to open is, if it is on the path to a cached count
// (usage, response, message, their usage, and the usage's
// prompt_tokens_details and input_tokens_details), or 0.
func (s *scanner) containerBit() uint8 {
	d, k := s.depth, s.keys[1:s.depth+1]
	usageAt := 1 // the depth of the usage on the path, if any
	switch {
	case d == 1 && (k[0] == keyUsage || k[0] == keyResponse || k[0] == keyMessage):
		return 1 << k[0]
	case d >= 2 && (k[0] == keyResponse || k[0] == keyMessage) && k[1] == keyUsage:
		if d == 2 {
			return 1 << (4 + k[0] - keyMessage)
		}
		usageAt = 2
	case d < 2 || k[0] != keyUsage:
		return 0
	}
	if d == usageAt+1 && (k[d-1] == keyPromptTokensDetails || k[d-1] == keyInputTokensDetails) {
		return 1 << (6 + k[d-1] - keyPromptTokensDetails)
	}
	return 0
}

// modelAt reports whether the value about to be read is where a
// response names its model: model, at the top, or in Anthropic's
// message or the Responses API's response; or Gemini's modelVersion.
func (s *scanner) modelAt() bool {
	switch s.depth {
	case 1:
		return s.keys[1] == keyModel || s.keys[1] == keyModelVersion
	case 2:
		return s.keys[2] == keyModel && (s.keys[1] == keyMessage || s.keys[1] == keyResponse)
	}
	return false
}

// keepModel reads, into the model, the bytes of p before n-1 (the
// closing quote), or all of p if n < 0. A model with an escape, or one
// longer than maxModel, is none.
func (s *scanner) keepModel(p []byte, n int) {
	if n >= 0 {
		p = p[:n-1]
	}
	if s.modelN < 0 {
		return
	}
	if len(p) > maxModel-s.modelN || bytes.IndexByte(p, '\\') >= 0 {
		s.modelN = -1
		return
	}
	s.modelN += copy(s.model[s.modelN:], p)
}

// endModel ends a value, of kind k, where a model's name is: a string
// read whole names the model, the last one given.
func (s *scanner) endModel(k kind) {
	if k == kindString {
		s.rec.hasModel = s.modelN >= 0
	}
	s.capturing = false
}

// stringEnd returns how many bytes of p, which begins inside a string,
// reach past its closing quote, or -1 if the string goes on after p.
func (s *scanner) stringEnd(p []byte) int {
	i := 0
	if s.esc {
		s.esc, i = false, 1
	}
	for i < len(p) {
		// Eight bytes at a time while none is a quote or a backslash,
		// then one at a time to the one that is.
		for i+8 <= len(p) && !special(binary.LittleEndian.Uint64(p[i:])) {
			i += 8
		}
		for i < len(p) && p[i] != '"' && p[i] != '\\' {
			i++
		}
		if i == len(p) {
			break
		}
		if p[i] == '"' {
			return i + 1
		}
		// An escape: the backslash and the byte after it.
		i += 2
	}
	s.esc = i > len(p)
	return -1
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// special reports whether any of the eight bytes of x is a quote or a
// backslash: x XOR the byte repeated has a zero byte where x has it, and
// (y - ones) &^ y sets the high bit of a byte of y only if y has a zero
// byte (at that byte or below it).
func special(x uint64) bool {
	q := x ^ (ones * '"')
	b := x ^ (ones * '\\')
	return ((q-ones)&^q|(b-ones)&^b)&highs != 0
}

// keepKey reads, into the key being read, the bytes of p before n-1 (the
// closing quote), or all of p if n < 0.
func (s *scanner) keepKey(p []byte, n int) {
	if n >= 0 {
		p = p[:n-1]
	}
	s.key.write(p)
}
