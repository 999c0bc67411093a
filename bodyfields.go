package ratelimit

import (
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/d61b427a/caddy-rate-limit/costfrom"
)

// This file answers the {body.<field>} placeholders: a field of the
// request's JSON body, named by the keys that lead to it from the
// top-level object joined by dots ({body.model},
// {body.metadata.user_id}), as text (costfrom.Value.Scalar). A zone's
// key and limit read them, and so does any handler after rate_limit, or
// a map whose output a zone reads.
//
// The body is read only for a zone that needs it: the first time a
// zone's key or limit asks for a field, the handler reads the body
// (once, up to MaxBody, handed on as it came) and resolves them again.
// A zone that asks for none reads nothing, so an upload through it
// streams on as it comes; a handler or log that asks for a field of a
// body no zone read finds it empty. A field is read as the most lenient
// server reads it (costfrom.Fields): a body that gives it, or an object
// on its path, twice under any spelling is refused with 400 before
// anything is taken.

// bodyPrefix begins the name of a {body.*} placeholder.
const bodyPrefix = "body."

// modelPlaceholder names {http.rate_limit.model}: the request's model,
// whatever its API's format, as a zone priced in money prices it. Google's
// Gemini API and Vertex AI name it in the request's path
// (/v1beta/models/gemini-2.5-flash:generateContent, see
// costfrom.PathModel), the other formats in the body's model, which
// {body.model} reads. It is read as a {body.*} is: the body is read for
// it (a body that gives model twice is refused), and it is empty if the
// request names no model.
const modelPlaceholder = "http.rate_limit.model"

// bodyFields answers one request's {body.*} placeholders, once a zone
// read its body.
type bodyFields struct {
	// text is the body, as costfrom.Text reads it.
	text []byte
	// pathModel is the model the request's path names, if it is a
	// Gemini one.
	pathModel string
	// err is the first *costfrom.DuplicateError of a field read, which
	// refuses the request if a zone read the field.
	err error
	// values are the first fields read, n of them: a config names a
	// few, and any more are read again each time they are asked for.
	values [4]bodyValue
	n      int
	// read is where a field is read into.
	read [1]costfrom.Value
}

// bodyValue is a field as bodyFields found it. Its text is kept as the
// replacer hands it on, so that a field asked for again (a key's second
// alternative, a map, a log) costs no allocation.
type bodyValue struct {
	path string
	text any
}

// setBody makes body, which a zone read, what the request's {body.*}
// read, and path, the request's URL path, where its model may be.
func (p *placeholders) setBody(path string, body []byte) {
	p.body, p.bodyWanted = &bodyFields{text: costfrom.Text(body)}, false
	p.body.pathModel, _ = costfrom.PathModel(path)
}

// model answers {http.rate_limit.model} as bodyField answers a field:
// before a zone read the body, it tells the handler so.
func (p *placeholders) model() (any, bool) {
	switch {
	case p.body == nil:
		p.bodyWanted = true
		return "", true
	case p.body.pathModel != "":
		return p.body.pathModel, true
	}
	return p.body.get("model")
}

// bodyField answers the placeholder body.<path>: the field's text;
// empty if no zone read the body, or if it is not JSON or does not give
// the field as a string, a number or a boolean. A path that names no
// field is unknown. Asked before a zone read the body, it tells the
// handler so (bodyWanted), which then reads it and asks again.
func (p *placeholders) bodyField(path string) (any, bool) {
	if p.body == nil {
		if bodyFieldsOf(path) == nil {
			return nil, false
		}
		p.bodyWanted = true
		return "", true
	}
	return p.body.get(path)
}

// get answers a field of the body for bodyField.
func (b *bodyFields) get(path string) (any, bool) {
	for _, v := range b.values[:b.n] {
		if v.path == path {
			return v.text, true
		}
	}
	f := bodyFieldsOf(path)
	if f == nil {
		return nil, false
	}
	var text any = ""
	if err := f.Read(b.text, b.read[:]); err != nil {
		if b.err == nil {
			b.err = err
		}
	} else if s, ok := b.read[0].Scalar(); ok {
		text = s
	}
	b.read[0] = costfrom.Value{}
	if b.n < len(b.values) {
		b.values[b.n] = bodyValue{path: path, text: text}
		b.n++
	}
	return text, true
}

// readFields reads the request's body, if no zone has yet, for a zone
// whose key or limit asks for a field of it, and makes it what p's
// {body.*} read.
func (s *scratch) readFields(w http.ResponseWriter, r *http.Request, p *placeholders, limits bodyLimits) error {
	if !s.bodyRead {
		if err := s.readBody(w, r, limits); err != nil {
			return err
		}
	}
	p.setBody(r.URL.Path, s.body)
	return nil
}

// bodyPaths holds the compiled Fields of each path a {body.*} of a
// loaded config names, so that a request reads it without compiling it.
// It grows with the templates of the configs loaded, never with
// requests: a path named otherwise (a map's source, a later handler) is
// compiled each time it is read.
var bodyPaths sync.Map

// {http.rate_limit.model} reads the body's model, whether or not a
// template names {body.model}.
func init() {
	compileBodyPaths("{" + bodyPrefix + "model}")
}

// bodyFieldsOf returns the Fields that reads path, or nil if path names
// no field.
func bodyFieldsOf(path string) *costfrom.Fields {
	if f, ok := bodyPaths.Load(path); ok {
		return f.(*costfrom.Fields)
	}
	f, err := newBodyFields(path)
	if err != nil {
		return nil
	}
	return f
}

// compileBodyPaths compiles the {body.*} placeholders of template a,
// which checkBodyPlaceholders accepted.
func compileBodyPaths(a string) {
	for _, path := range bodyPlaceholders(a) {
		if _, ok := bodyPaths.Load(path); ok {
			continue
		}
		if f, err := newBodyFields(path); err == nil {
			bodyPaths.Store(path, f)
		}
	}
}

// bodyPlaceholders returns the paths of the {body.*} placeholders in
// template a.
func bodyPlaceholders(a string) []string {
	var paths []string
	for _, p := range placeholderPattern.FindAllString(a, -1) {
		if path, ok := strings.CutPrefix(p[1:len(p)-1], bodyPrefix); ok {
			paths = append(paths, path)
		}
	}
	return paths
}

// pathPatterns are the characters of the path syntax of GJSON (array
// counts and queries, wildcards, modifiers, pipes), which caddy-ext's
// requestbodyvar read {body.*} with: a path here names object keys only.
const pathPatterns = "#*?@|"

// newBodyFields compiles path, refusing what names no field of an
// object.
func newBodyFields(path string) (*costfrom.Fields, error) {
	if i := strings.IndexAny(path, pathPatterns); i >= 0 {
		return nil, fmt.Errorf("want object keys joined by dots, got the path syntax %q", path[i:i+1])
	}
	return costfrom.NewFields(path)
}

// checkBodyPlaceholders refuses a {body.*} placeholder of template a
// that names no field of an object.
func checkBodyPlaceholders(a string) error {
	for _, path := range bodyPlaceholders(a) {
		if _, err := newBodyFields(path); err != nil {
			return fmt.Errorf("{body.%s}: %v (a {body.*} names a field of the JSON body by the keys that lead to it from the top-level object, joined by dots, such as {body.model} or {body.metadata.user_id}; array elements and patterns are not read)", path, err)
		}
	}
	return nil
}
