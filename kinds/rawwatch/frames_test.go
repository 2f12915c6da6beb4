package rawwatch

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// readers are the ways a stream may arrive: whole, a byte at a time, half
// of what was asked for at a time, and with its last data together with
// io.EOF.
var readers = map[string]func(io.Reader) io.Reader{
	"whole":     func(r io.Reader) io.Reader { return r },
	"one byte":  iotest.OneByteReader,
	"half":      iotest.HalfReader,
	"data+EOF":  iotest.DataErrReader,
	"one+EOF":   func(r io.Reader) io.Reader { return iotest.DataErrReader(iotest.OneByteReader(r)) },
	"half+EOF":  func(r io.Reader) io.Reader { return iotest.DataErrReader(iotest.HalfReader(r)) },
	"two reads": func(r io.Reader) io.Reader { return io.MultiReader(io.LimitReader(r, 7), r) },
}

// TestFramesLongEvent stops at an event longer than the limit, however the
// stream arrives, instead of buffering it: a stream whose object never
// closes must not take the process's memory.
func TestFramesLongEvent(t *testing.T) {
	const limit = 4 * minRead
	event := `{"a":"` + strings.Repeat("x", limit-8) + `"}`
	for _, tc := range []struct {
		name   string
		stream func() io.Reader
		want   []string
		// tooLong: the frames end with the error for an event's length,
		// else with io.EOF.
		tooLong bool
	}{
		{name: "at the limit", stream: func() io.Reader { return strings.NewReader(event + "\n" + `{}`) }, want: []string{event, `{}`}},
		{name: "one byte over", stream: func() io.Reader { return strings.NewReader(`{"a":"x` + event[6:]) }, tooLong: true},
		{name: "after an event", stream: func() io.Reader {
			return io.MultiReader(strings.NewReader(`{"a":1}`+"\n"+`{"b":"`), endless('x'))
		}, want: []string{`{"a":1}`}, tooLong: true},
		{name: "a string that never closes", stream: func() io.Reader {
			return io.MultiReader(strings.NewReader(`{"a":"`), endless('x'))
		}, tooLong: true},
		{name: "brackets that never close", stream: func() io.Reader {
			return io.MultiReader(strings.NewReader(`{"a":`), endless('['))
		}, tooLong: true},
	} {
		for rname, wrap := range readers {
			t.Run(tc.name+"/"+rname, func(t *testing.T) {
				f := newFrames(wrap(tc.stream()))
				f.max = limit
				got, err := readAll(f)
				if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
					t.Errorf("frames %q, want %q", got, tc.want)
				}
				if tc.tooLong {
					if err == nil || !strings.Contains(err.Error(), "longer than") {
						t.Errorf("then %v, want an error for the event's length", err)
					}
				} else if !errors.Is(err, io.EOF) {
					t.Errorf("then %v, want io.EOF", err)
				}
				if len(f.buf) > 2*limit+2*minRead {
					t.Errorf("buffer grew to %d bytes, with a limit of %d", len(f.buf), limit)
				}
			})
		}
	}
}

// readAll returns the frames f reads until its first error, and that
// error.
func readAll(f *frames) ([]string, error) {
	var got []string
	for {
		frame, err := f.next()
		if err != nil {
			return got, err
		}
		got = append(got, string(frame))
	}
}

// endless is a stream of c that never ends.
type endless byte

func (e endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(e)
	}
	return len(p), nil
}

// TestFrames frames streams as the API server writes them and as it would
// not, read every way a body may be.
func TestFrames(t *testing.T) {
	big := `{"type":"ADDED","object":{"data":"` + strings.Repeat(`x\"{[`, 3*minRead) + `"}}`
	for _, tc := range []struct {
		name, stream string
		want         []string
		// err is the error after the frames: io.EOF, io.ErrUnexpectedEOF,
		// or another containing errText.
		err     error
		errText string
	}{
		{name: "empty", stream: "", err: io.EOF},
		{name: "whitespace", stream: " \n\t\r\n", err: io.EOF},
		{name: "events", stream: `{"type":"ADDED","object":{"a":[1,{"b":null}]}}` + "\n" + `{"type":"DELETED","object":{}}` + "\n",
			want: []string{`{"type":"ADDED","object":{"a":[1,{"b":null}]}}`, `{"type":"DELETED","object":{}}`}, err: io.EOF},
		{name: "no newlines", stream: `{"a":1}{"b":2}  {"c":3}`, want: []string{`{"a":1}`, `{"b":2}`, `{"c":3}`}, err: io.EOF},
		{name: "brackets in strings", stream: `{"a":"}]\"{[","b":"\\","c":"\\\"}"}` + "\n",
			want: []string{`{"a":"}]\"{[","b":"\\","c":"\\\"}"}`}, err: io.EOF},
		{name: "larger than a read", stream: big + "\n" + `{}`, want: []string{big, `{}`}, err: io.EOF},
		{name: "ends in an object", stream: `{"a":1}` + "\n" + `{"b":[2,`, want: []string{`{"a":1}`}, err: io.ErrUnexpectedEOF},
		{name: "ends in a string", stream: `{"a":"}`, err: io.ErrUnexpectedEOF},
		{name: "ends after a backslash", stream: `{"a":"\`, err: io.ErrUnexpectedEOF},
		{name: "not an object", stream: `{}` + "\n" + `[{}]`, want: []string{`{}`}, errText: `starts with '['`},
		{name: "a number", stream: `1`, errText: `starts with '1'`},
		{name: "invalid", stream: `{"a":}`, errText: "not valid JSON"},
		{name: "too many closing brackets", stream: `{"a":1}}`, want: []string{`{"a":1}`}, errText: `starts with '}'`},
		{name: "mismatched brackets", stream: `{"a":[1}]`, errText: "not valid JSON"},
	} {
		for rname, wrap := range readers {
			t.Run(tc.name+"/"+rname, func(t *testing.T) {
				f := newFrames(wrap(strings.NewReader(tc.stream)))
				got, err := readAll(f)
				if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
					t.Errorf("frames %q, want %q", got, tc.want)
				}
				switch {
				case tc.err != nil && !errors.Is(err, tc.err):
					t.Errorf("then %v, want %v", err, tc.err)
				case tc.err == nil && (err == nil || !strings.Contains(err.Error(), tc.errText)):
					t.Errorf("then %v, want an error with %q", err, tc.errText)
				}
			})
		}
	}
}

// FuzzFrames checks frames against encoding/json's Decoder, which framed
// the stream before: the same objects, then an error where the Decoder
// fails or finds anything but an object.
func FuzzFrames(f *testing.F) {
	for _, s := range []string{`{"a":1}` + "\n" + `{"b":"}"}`, `{"a":[{}]} {}`, `{"a":"\\\""}`, `[1]`, `{"a":`, benchEvent(1) + benchEvent(2)} {
		f.Add([]byte(s), uint8(0))
	}
	f.Fuzz(func(t *testing.T, data []byte, how uint8) {
		wraps := []func(io.Reader) io.Reader{readers["whole"], readers["one byte"], readers["half"], readers["data+EOF"]}
		fr := newFrames(wraps[int(how)%len(wraps)](bytes.NewReader(data)))
		dec := json.NewDecoder(bytes.NewReader(data))
		for i := 0; ; i++ {
			var want json.RawMessage
			derr := dec.Decode(&want)
			got, err := fr.next()
			switch {
			case derr == io.EOF:
				if !errors.Is(err, io.EOF) {
					t.Fatalf("value %d: the Decoder ends, frames gives %q, %v", i, got, err)
				}
				return
			case derr != nil || want[0] != '{':
				if err == nil {
					t.Fatalf("value %d: the Decoder gives %q, %v; frames gives %q, want an error", i, want, derr, got)
				}
				return
			case err != nil:
				t.Fatalf("value %d: the Decoder gives %q; frames fails: %v", i, want, err)
			case !bytes.Equal(got, want):
				t.Fatalf("value %d: frames gives %q, the Decoder %q", i, got, want)
			}
		}
	})
}
