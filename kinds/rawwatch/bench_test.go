package rawwatch

import (
	"bytes"
	"fmt"
	"io"
	"testing"
)

// benchEvent is a watch event of a VirtualMachine as the bench's rounds
// without vmipam create them: a static address, a few labels, managedFields.
func benchEvent(i int) string {
	return fmt.Sprintf(`{"type":"ADDED","object":{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine","metadata":{"creationTimestamp":"2026-12-07T07:42:11Z","generateName":"bench-","generation":1,"labels":{"vmipam.io/bench":"without"},"managedFields":[{"apiVersion":"vmipam.io/v1alpha1","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:generateName":{},"f:labels":{".":{},"f:vmipam.io/bench":{}}},"f:spec":{".":{},"f:cpus":{},"f:ip":{},"f:memory":{}}},"manager":"e2ebench","operation":"Update","time":"2026-12-07T07:42:11Z"}],"name":"bench-%05d","namespace":"bench-without","resourceVersion":"%d","uid":"0a1b2c3d-4e5f-6789-abcd-%012d"},"spec":{"cpus":1,"ip":"10.250.%d.%d","memory":"1Gi"}}}`+"\n", i, 100000+i, i, i/250, i%250)
}

// BenchmarkDecode decodes a stream of ADDED events, as a replica's watch
// of the unlabelled objects reads them, per event.
func BenchmarkDecode(b *testing.B) {
	var stream bytes.Buffer
	const n = 1000
	for i := range n {
		stream.WriteString(benchEvent(i))
	}
	data := stream.Bytes()
	b.SetBytes(int64(len(data) / n))
	b.ReportAllocs()
	var d *eventDecoder
	left := 0
	for b.Loop() {
		if left == 0 {
			body := io.NopCloser(bytes.NewReader(data))
			d = &eventDecoder{body: body, frames: newFrames(body), decode: vm.DecodeTrimmed}
			left = n
		}
		if _, _, err := d.Decode(); err != nil {
			b.Fatal(err)
		}
		left--
	}
}
