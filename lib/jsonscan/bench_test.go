package jsonscan

import "testing"

// BenchmarkExtract reads the webhook's values from a typical admission
// review, from a hostile VirtualMachine of about 3 MiB, most of it a
// status.conditions array of 250,000 entries that must be skipped, and
// from one of 7 MiB of annotations whose keys all hold an escape, which
// must be walked and compared.
func BenchmarkExtract(b *testing.B) {
	benches := map[string]struct {
		data  []byte
		paths [][]string
	}{
		"review-2KiB":          {data: []byte(review), paths: reviewPaths},
		"conditions-250k-3MiB": {data: hostileVM(250_000), paths: objectPaths},
		"escaped-keys-7MiB":    {data: escapedAnnotations(7 << 20), paths: objectPaths},
	}
	for name, bc := range benches {
		b.Run(name, func(b *testing.B) {
			b.Run("Extract", func(b *testing.B) {
				b.SetBytes(int64(len(bc.data)))
				b.ReportAllocs()
				for b.Loop() {
					Extract(bc.data, bc.paths...)
				}
			})
			b.Run("AppendExtract", func(b *testing.B) {
				dst := make([][]byte, 0, len(bc.paths))
				b.SetBytes(int64(len(bc.data)))
				b.ReportAllocs()
				for b.Loop() {
					dst = AppendExtract(dst[:0], bc.data, bc.paths...)
				}
			})
		})
	}
}
