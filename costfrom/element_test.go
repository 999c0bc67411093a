package costfrom

import (
	"strings"
	"testing"
)

// TestObjectEnd: objectEnd takes a whole object of valid JSON, and
// nothing else.
func TestObjectEnd(t *testing.T) {
	deep := strings.Repeat(`{"a":`, maxElementDepth+1) + "1" + strings.Repeat("}", maxElementDepth+1)
	for _, c := range []struct {
		p    string
		want int // the object's length, or 0
	}{
		{`{}`, 2},
		{` {}`, 0},
		{`{} ,{}`, 2},
		{`{"a":1}]`, 7},
		{`{ "a" : [ 1 , -2.5e+3 , 0 , true , false , null , "x" , { } , [ ] ] }`, 69},
		{`{"a":"q\"uote}"}`, 16},
		{`{"a":"\\"}`, 10},
		{`{"a":"\\\"}"}`, 13},
		{`{"a":{"b":{"c":[{"d":"e"}]}}}`, 29},
		{`{"a":1`, 0},
		{`{"a":"1}`, 0},
		{`{"a" 1}`, 0},
		{`{"a":1,}`, 0},
		{`{"a":1 "b":2}`, 0},
		{`{,}`, 0},
		{`{1:1}`, 0},
		{`{"a":[1,]}`, 0},
		{`{"a":[1}`, 0},
		{`{"a":{]}`, 0},
		{`{"a":tru}`, 0},
		{`{"a":nul}`, 0},
		{`{"a":01}`, 0},
		{`{"a":-}`, 0},
		{`{"a":1.}`, 0},
		{`{"a":1e}`, 0},
		{`{"a":+1}`, 0},
		{`{"a":'x'}`, 0},
		{`[]`, 0},
		{`"s"`, 0},
		{``, 0},
		{deep, 0},
		{deep[len(`{"a":`) : len(deep)-1], len(deep) - len(`{"a":`) - 1},
	} {
		if got := objectEnd([]byte(c.p)); got != c.want {
			t.Errorf("objectEnd(%q) = %d, want %d", c.p, got, c.want)
		}
	}
}
