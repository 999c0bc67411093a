package costfrom

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
)

// scalarOf reads the field "f" of body and returns it as Scalar does.
func scalarOf(t *testing.T, body string) (string, bool) {
	t.Helper()
	f, err := NewFields("f")
	if err != nil {
		t.Fatal(err)
	}
	var v [1]Value
	if err := f.Read(Text([]byte(body)), v[:]); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return v[0].Scalar()
}

// TestScalar: a field reads as its decoded value: a string's text, a
// number's exact value in the shortest decimal form, true or false; and
// as none for null, an object, an array or text that is not JSON.
func TestScalar(t *testing.T) {
	for _, c := range []struct {
		value, want string
		ok          bool
	}{
		{`"gpt-4o"`, "gpt-4o", true},
		{`"\u0031000"`, "1000", true},
		{`"gpt\/4o \"mini\""`, `gpt/4o "mini"`, true},
		{`""`, "", true},
		{`"modèle"`, "modèle", true},
		{"\"bad \xff byte\"", "bad \ufffd byte", true},
		{"\"a\tb\"", "", false},
		{`1000`, "1000", true},
		{`1e3`, "1000", true},
		{`1E+3`, "1000", true},
		{`10e2`, "1000", true},
		{`1000.0`, "1000", true},
		{`0.1e4`, "1000", true},
		{`100000e-2`, "1000", true},
		{`-1000`, "-1000", true},
		{`0`, "0", true},
		{`-0.0e7`, "0", true},
		{`0.5`, "0.5", true},
		{`5e-1`, "0.5", true},
		{`1.50`, "1.5", true},
		{`0.000001`, "0.000001", true},
		{`1e-7`, "1e-7", true},
		{`123e-10`, "1.23e-8", true},
		{`1e21`, "1e+21", true},
		{`123456789012345678901`, "123456789012345678901", true},
		{`1.5e300`, "1.5e+300", true},
		{`1e007`, "10000000", true},
		// Kept exactly: a float64 would make these one number.
		{`1234567890123456789`, "1234567890123456789", true},
		{`1234567890123456788`, "1234567890123456788", true},
		{`true`, "true", true},
		{`false`, "false", true},
		{`null`, "", false},
		{`{"a":1}`, "", false},
		{`[1]`, "", false},
		{`01`, "", false},
		{`1.`, "", false},
		{`.5`, "", false},
		{`1e`, "", false},
		{`+1`, "", false},
		{`NaN`, "", false},
		{`Infinity`, "", false},
		{`tru`, "", false},
		{`1e9999999999`, "", false},
		{`"unterminated`, "", false},
	} {
		got, ok := scalarOf(t, `{"f":`+c.value+`}`)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: %q %v, want %q %v", c.value, got, ok, c.want, c.ok)
		}
	}
}

// TestScalarKeysAsModel: a field read by its own Fields reads as
// Request reads the same field, key spellings, encodings and duplicates
// alike: {body.model} is the model a zone prices by.
func TestScalarKeysAsModel(t *testing.T) {
	f, err := NewFields("model")
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{
		`{"model":"gpt-4o"}`,
		`{"MODEL":"gpt-4o","messages":[]}`,
		`{"mod\u0065l":"gpt-4o"}`,
		`{"model":"a","Model":"b"}`,
		"\xef\xbb\xbf" + `{"model":"gpt-4o"}`,
		"\xff\xfe{\x00\"\x00m\x00o\x00d\x00e\x00l\x00\"\x00:\x00\"\x00x\x00\"\x00}\x00",
		`{"model":{"name":"x"}}`,
		`not json`,
		`{"messages":[{"model":"inner"}]}`,
	} {
		var req Request
		reqErr := req.Read("", []byte(body))
		var v [1]Value
		fieldErr := f.Read(Text([]byte(body)), v[:])
		var dup *DuplicateError
		if (reqErr == nil) != (fieldErr == nil) || reqErr != nil && (!errors.As(fieldErr, &dup) || dup.Field != "model") {
			t.Errorf("%q: Request %v, field %v", body, reqErr, fieldErr)
			continue
		}
		model, hasModel := req.Model()
		text, ok := v[0].Scalar()
		if hasModel != ok || model != text {
			t.Errorf("%q: model %q %v, field %q %v", body, model, hasModel, text, ok)
		}
	}
}

// FuzzScalarNumber holds Scalar's form of a number against Go's
// encoding/json and strconv: every JSON number has one, which is a JSON
// number of the same value (as a float64), and the same form comes of
// writing it again.
func FuzzScalarNumber(f *testing.F) {
	for _, s := range []string{"0", "-0", "1000", "1e3", "0.001", "1.5E-7", "123456789012345678901234567890", "4.9e-324", "1e308", "1e309"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var n json.Number
		if json.Unmarshal([]byte(s), &n) != nil || string(n) != strings.TrimSpace(s) {
			return
		}
		s = string(n)
		got, ok := decimal([]byte(s))
		if !ok {
			if exponent := strings.IndexAny(s, "eE"); exponent < 0 || len(s)-exponent < 10 {
				t.Fatalf("%s: no form", s)
			}
			return
		}
		if !json.Valid([]byte(got)) {
			t.Fatalf("%s: form %q is not JSON", s, got)
		}
		want, err1 := strconv.ParseFloat(s, 64)
		back, err2 := strconv.ParseFloat(got, 64)
		if (err1 == nil) != (err2 == nil) || err1 == nil && want != back {
			t.Fatalf("%s: form %q reads as %v, want %v", s, got, back, want)
		}
		if again, _ := decimal([]byte(got)); again != got {
			t.Fatalf("%s: form %q, then %q", s, got, again)
		}
	})
}
