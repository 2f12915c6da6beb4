package jsonscan

import (
	"encoding/json"
	"fmt"
)

// Kind is the type of a JSON value.
//
// The constants carry a Kind prefix because String is also the function
// that decodes a string value.
type Kind uint8

const (
	// KindInvalid is no value at all: nil or empty input, or a first byte
	// that starts no JSON value.
	KindInvalid Kind = iota
	// KindObject is a JSON object.
	KindObject
	// KindArray is a JSON array.
	KindArray
	// KindString is a JSON string.
	KindString
	// KindNumber is a JSON number.
	KindNumber
	// KindBool is true or false.
	KindBool
	// KindNull is null.
	KindNull
)

// String returns the kind's name as JSON Schema spells it ("object",
// "boolean", ...), or "invalid".
func (k Kind) String() string {
	switch k {
	case KindObject:
		return "object"
	case KindArray:
		return "array"
	case KindString:
		return "string"
	case KindNumber:
		return "number"
	case KindBool:
		return "boolean"
	case KindNull:
		return "null"
	default:
		return "invalid"
	}
}

// phrase is the kind as it reads after "is" in an error message.
func (k Kind) phrase() string {
	switch k {
	case KindObject:
		return "an object"
	case KindArray:
		return "an array"
	case KindString:
		return "a string"
	case KindNumber:
		return "a number"
	case KindBool:
		return "a boolean"
	case KindNull:
		return "null"
	default:
		return "not a JSON value"
	}
}

// KindOf returns the kind of the JSON value raw, judging by its first byte
// after any whitespace. It does not check that the rest is well-formed.
func KindOf(raw []byte) Kind {
	i := skipSpace(raw, 0)
	if i >= len(raw) {
		return KindInvalid
	}
	switch c := raw[i]; {
	case c == '{':
		return KindObject
	case c == '[':
		return KindArray
	case c == '"':
		return KindString
	case c == '-' || '0' <= c && c <= '9':
		return KindNumber
	case c == 't' || c == 'f':
		return KindBool
	case c == 'n':
		return KindNull
	default:
		return KindInvalid
	}
}

// String decodes the JSON string value raw. It fails if raw is anything
// else, null included. A string without escapes costs one copy; one with
// escapes is decoded by encoding/json.
func String(raw []byte) (string, error) {
	raw = trimSpace(raw)
	if k := KindOf(raw); k != KindString {
		return "", fmt.Errorf("value is %s, not a string", k.phrase())
	}
	if end := skipString(raw, 1); end == len(raw) && isPlain(raw[1:end-1]) {
		return string(raw[1 : end-1]), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("decode string: %w", err)
	}
	return s, nil
}

// Strings decodes the JSON array of strings raw. It refuses, before
// decoding any element, an array of more than max elements or one holding
// anything but strings, saying which; so a hostile array costs a scan, not
// an allocation per element. A negative max is an error.
func Strings(raw []byte, max int) ([]string, error) {
	if max < 0 {
		return nil, fmt.Errorf("negative maximum %d", max)
	}
	n, tooMany := 0, false
	var bad error
	err := Each(raw, func(i int, elem []byte) bool {
		if i >= max {
			tooMany = true
			return false
		}
		if k := KindOf(elem); k != KindString {
			bad = fmt.Errorf("element %d is %s, not a string", i, k.phrase())
			return false
		}
		n++
		return true
	})
	switch {
	case err != nil:
		return nil, err
	case tooMany:
		return nil, fmt.Errorf("more than %d elements", max)
	case bad != nil:
		return nil, bad
	}

	out := make([]string, 0, n)
	err = Each(raw, func(i int, elem []byte) bool {
		var s string
		if s, bad = String(elem); bad != nil {
			bad = fmt.Errorf("element %d: %w", i, bad)
			return false
		}
		out = append(out, s)
		return true
	})
	switch {
	case err != nil:
		return nil, err
	case bad != nil:
		return nil, bad
	}
	return out, nil
}

// Each calls fn with the index and raw bytes (whitespace trimmed, a
// subslice of raw) of each element of the JSON array raw, in order, until
// fn returns false. It fails if raw is not an array or, once it notices,
// if the array is malformed; elements before the fault have been seen by
// fn. Each does not allocate.
func Each(raw []byte, fn func(i int, elem []byte) bool) error {
	i := skipSpace(raw, 0)
	if k := KindOf(raw[i:]); k != KindArray {
		return fmt.Errorf("value is %s, not an array", k.phrase())
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return nil
	}
	for n := 0; ; n++ {
		end := skipValue(raw, i)
		if end < 0 {
			return fmt.Errorf("malformed array: element %d at byte %d", n, i)
		}
		if !fn(n, raw[i:end:end]) {
			return nil
		}
		if i = skipSpace(raw, end); i >= len(raw) {
			return fmt.Errorf("malformed array: unterminated after element %d", n)
		}
		switch raw[i] {
		case ',':
			i = skipSpace(raw, i+1)
		case ']':
			return nil
		default:
			return fmt.Errorf("malformed array: byte %d after element %d", i, n)
		}
	}
}

// Members calls fn with each member of the JSON object raw, in order,
// until fn returns false. key is the member name as written between its
// quotes, escapes not decoded (compare it with KeyEquals, decode it with
// UnquoteKey); value is the member's raw value, whitespace trimmed. Both
// are subslices of raw. A name that occurs twice is reported twice; to
// follow encoding/json, let the later one win. Members fails if raw is not
// an object or, once it notices, if the object is malformed. It does not
// allocate.
func Members(raw []byte, fn func(key, value []byte) bool) error {
	i := skipSpace(raw, 0)
	if k := KindOf(raw[i:]); k != KindObject {
		return fmt.Errorf("value is %s, not an object", k.phrase())
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return nil
	}
	for n := 0; ; n++ {
		if i >= len(raw) || raw[i] != '"' {
			return fmt.Errorf("malformed object: member %d at byte %d", n, i)
		}
		keyEnd := skipString(raw, i+1)
		if keyEnd < 0 {
			return fmt.Errorf("malformed object: unterminated name of member %d", n)
		}
		key := raw[i+1 : keyEnd-1 : keyEnd-1]
		if i = skipSpace(raw, keyEnd); i >= len(raw) || raw[i] != ':' {
			return fmt.Errorf("malformed object: no colon after name of member %d", n)
		}
		i = skipSpace(raw, i+1)
		end := skipValue(raw, i)
		if end < 0 {
			return fmt.Errorf("malformed object: value of member %d at byte %d", n, i)
		}
		if !fn(key, raw[i:end:end]) {
			return nil
		}
		if i = skipSpace(raw, end); i >= len(raw) {
			return fmt.Errorf("malformed object: unterminated after member %d", n)
		}
		switch raw[i] {
		case ',':
			i = skipSpace(raw, i+1)
		case '}':
			return nil
		default:
			return fmt.Errorf("malformed object: byte %d after member %d", i, n)
		}
	}
}

// KeyEquals reports whether the member name key, as Members gives it
// (between the quotes, escapes not decoded), decodes to want, as
// encoding/json would decode it. It does not allocate.
func KeyEquals(key []byte, want string) bool {
	return nameEquals(key, want)
}

// UnquoteKey decodes the member name key, as Members gives it (between the
// quotes, escapes not decoded), as encoding/json would.
func UnquoteKey(key []byte) (string, error) {
	if isPlain(key) {
		return string(key), nil
	}
	quoted := make([]byte, 0, len(key)+2)
	quoted = append(append(append(quoted, '"'), key...), '"')
	var s string
	if err := json.Unmarshal(quoted, &s); err != nil {
		return "", fmt.Errorf("unquote member name: %w", err)
	}
	return s, nil
}
