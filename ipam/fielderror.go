package ipam

import (
	"fmt"
	"strconv"
	"strings"
)

// Step is one step of a Path: a field name, optionally followed by an index
// into the list the field holds.
type Step struct {
	// Field is the field's name, as the user writes it ("ranges").
	Field string
	// Index is the position in the field's list, when Indexed.
	Index   int
	Indexed bool
}

// Path says where a value sits in the input, as the steps from its root:
// ranges[1].exclude[0] is {ranges 1} {exclude 0}. Callers map it onto their
// own paths (the webhook onto field.Path under spec) without parsing text.
type Path []Step

// Child returns p followed by the field name.
func (p Path) Child(name string) Path {
	return append(p[:len(p):len(p)], Step{Field: name})
}

// Index returns p with its last step indexed by i.
func (p Path) Index(i int) Path {
	q := append(Path(nil), p...)
	if len(q) > 0 {
		q[len(q)-1].Index, q[len(q)-1].Indexed = i, true
	}
	return q
}

// String writes p as ranges[1].exclude[0].
func (p Path) String() string {
	var b strings.Builder
	for i, s := range p {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(s.Field)
		if s.Indexed {
			b.WriteString("[" + strconv.Itoa(s.Index) + "]")
		}
	}
	return b.String()
}

// ErrorType says what kind of problem a FieldError is, as Kubernetes'
// field.ErrorType does.
type ErrorType uint8

const (
	// ErrorTypeInvalid is a value that is there and wrong.
	ErrorTypeInvalid ErrorType = iota
	// ErrorTypeRequired is a value that is missing.
	ErrorTypeRequired
)

// FieldError is one invalid input value: where it came from, the value,
// and what is wrong and how to fix it.
type FieldError struct {
	Path   Path
	Type   ErrorType
	Value  string
	Detail string
}

// Field returns the error's path as text, such as "ranges[0].cidr".
func (e *FieldError) Field() string { return e.Path.String() }

func (e *FieldError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("%s: %s", e.Path, e.Detail)
	}
	return fmt.Sprintf("%s: invalid value %q: %s", e.Path, e.Value, e.Detail)
}

// FieldErrors is every problem found in one input, reported together so the
// user can fix them in one pass. It matches ErrInvalid.
type FieldErrors []*FieldError

func (l FieldErrors) Error() string {
	msgs := make([]string, len(l))
	for i, e := range l {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "; ")
}

// Is reports whether target is ErrInvalid.
func (l FieldErrors) Is(target error) bool { return target == ErrInvalid }
