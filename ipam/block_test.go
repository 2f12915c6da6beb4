package ipam

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// btBitmap returns a bitmap with the given offsets set.
func btBitmap(offs ...int) *Bitmap {
	bm := new(Bitmap)
	for _, o := range offs {
		bm.Set(o)
	}
	return bm
}

// btFull returns a bitmap with every offset set.
func btFull() *Bitmap {
	bm := new(Bitmap)
	for i := range BlockSize {
		bm.Set(i)
	}
	return bm
}

// btDiff describes how two blocks differ, or returns "" when they are equal.
// Holders with an empty bitmap count as absent, nil maps as empty ones, and
// deadlines are compared as instants.
func btDiff(got, want Block) string {
	var d []string
	if got.Prefix != want.Prefix {
		d = append(d, fmt.Sprintf("Prefix = %v, want %v", got.Prefix, want.Prefix))
	}
	if got.Version != want.Version {
		d = append(d, fmt.Sprintf("Version = %q, want %q", got.Version, want.Version))
	}
	nonEmpty := func(m map[string]*Bitmap) map[string]*Bitmap {
		out := map[string]*Bitmap{}
		for h, bm := range m {
			if bm != nil && !bm.Empty() {
				out[h] = bm
			}
		}
		return out
	}
	gc, wc := nonEmpty(got.Claims), nonEmpty(want.Claims)
	for h, wbm := range wc {
		gbm, ok := gc[h]
		switch {
		case !ok:
			d = append(d, fmt.Sprintf("holder %q missing", h))
		case *gbm != *wbm:
			d = append(d, fmt.Sprintf("holder %q: claims differ", h))
		}
	}
	for h := range gc {
		if _, ok := wc[h]; !ok {
			d = append(d, fmt.Sprintf("unexpected holder %q", h))
		}
	}
	for a, wt := range want.Cooldowns {
		gt, ok := got.Cooldowns[a]
		switch {
		case !ok:
			d = append(d, fmt.Sprintf("cooldown of %v missing", a))
		case !gt.Equal(wt):
			d = append(d, fmt.Sprintf("cooldown of %v = %v, want %v", a, gt.UTC(), wt.UTC()))
		}
	}
	for a := range got.Cooldowns {
		if _, ok := want.Cooldowns[a]; !ok {
			d = append(d, fmt.Sprintf("unexpected cooldown of %v", a))
		}
	}
	slices.Sort(d)
	return strings.Join(d, "; ")
}

// btJSON returns e as JSON, the form a store keeps.
func btJSON(tb testing.TB, e EncodedBlock) string {
	tb.Helper()
	raw, err := json.Marshal(e)
	if err != nil {
		tb.Fatal(err)
	}
	return string(raw)
}

func TestBlockOf(t *testing.T) {
	tests := map[string]struct {
		addr   string
		block  string
		offset int
	}{
		"ipv4":                   {"10.1.2.3", "10.1.0.0/20", 0x203},
		"ipv4 first of block":    {"10.1.16.0", "10.1.16.0/20", 0},
		"ipv4 last of block":     {"10.1.15.255", "10.1.0.0/20", BlockSize - 1},
		"ipv4 zero":              {"0.0.0.0", "0.0.0.0/20", 0},
		"ipv4 top":               {"255.255.255.255", "255.255.240.0/20", BlockSize - 1},
		"ipv6":                   {"fd00::1:2345", "fd00::1:2000/116", 0x345},
		"ipv6 first of block":    {"fd00::1:3000", "fd00::1:3000/116", 0},
		"ipv6 last of block":     {"fd00::1:2fff", "fd00::1:2000/116", BlockSize - 1},
		"ipv6 high bits":         {"fd00:1:2:3:4:5:6:7", "fd00:1:2:3:4:5:6:0/116", 7},
		"ipv6 top":               {"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:f000/116", BlockSize - 1},
		"ipv6 zero":              {"::", "::/116", 0},
		"ipv6 spanning 64 bits":  {"fd00::ffff:ffff:ffff:fabc", "fd00::ffff:ffff:ffff:f000/116", 0xabc},
		"ipv4-compatible ipv6":   {"::10.1.2.3", "::10.1.0.0/116", 0x203},
		"ipv6 block of 4096 v4s": {"fd00::a01:fff", "fd00::a01:0/116", 0xfff},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a := netip.MustParseAddr(tc.addr)
			p := BlockOf(a)
			if want := netip.MustParsePrefix(tc.block); p != want {
				t.Fatalf("BlockOf(%v) = %v, want %v", a, p, want)
			}
			if !p.Contains(a) {
				t.Errorf("BlockOf(%v) = %v does not contain it", a, p)
			}
			if got := blockOffset(a); got != tc.offset {
				t.Errorf("blockOffset(%v) = %d, want %d", a, got, tc.offset)
			}
			if got := blockAddr(p, tc.offset); got != a {
				t.Errorf("blockAddr(%v, %d) = %v, want %v", p, tc.offset, got, a)
			}
		})
	}
	// Every offset of a block maps back to itself.
	for _, block := range []string{"10.0.16.0/20", "fd00::f000/116"} {
		p := netip.MustParsePrefix(block)
		for off := range BlockSize {
			a := blockAddr(p, off)
			if BlockOf(a) != p || blockOffset(a) != off {
				t.Fatalf("blockAddr(%v, %d) = %v, whose block is %v at offset %d", p, off, a, BlockOf(a), blockOffset(a))
			}
		}
	}
}

func TestBlockBitmap(t *testing.T) {
	var bm Bitmap
	if !bm.Empty() {
		t.Fatal("zero Bitmap is not empty")
	}
	offs := []int{0, 1, 63, 64, 127, 2048, BlockSize - 1}
	for _, o := range offs {
		bm.Set(o)
	}
	for i := range BlockSize {
		if got, want := bm.Has(i), slices.Contains(offs, i); got != want {
			t.Fatalf("Has(%d) = %v, want %v", i, got, want)
		}
	}
	var each []int
	bm.Each(func(off int) { each = append(each, off) })
	if !slices.Equal(each, offs) {
		t.Fatalf("Each visited %v, want %v", each, offs)
	}
	for _, o := range offs {
		bm.Clear(o)
	}
	if !bm.Empty() {
		t.Fatalf("Bitmap not empty after clearing every offset: %v", bm)
	}
}

func TestBlockClone(t *testing.T) {
	a := netip.MustParseAddr("10.0.0.5")
	b := Block{
		Prefix: netip.MustParsePrefix("10.0.0.0/20"), Version: "7",
		Claims:    map[string]*Bitmap{"h1": btBitmap(5)},
		Cooldowns: map[netip.Addr]time.Time{a: time.Unix(100, 0)},
	}
	c := b.Clone()
	c.Claims["h1"].Set(6)
	c.Claims["h2"] = btBitmap(7)
	c.Cooldowns[a] = time.Unix(200, 0)
	if b.Claims["h1"].Has(6) || len(b.Claims) != 1 || !b.Cooldowns[a].Equal(time.Unix(100, 0)) {
		t.Fatalf("changing a clone changed the original: %+v", b)
	}
	if h, ok := c.holderOf(7); !ok || h != "h2" {
		t.Fatalf("holderOf(7) = %q, %v; want h2", h, ok)
	}
	if h, ok := b.holderOf(7); ok {
		t.Fatalf("holderOf(7) on the original = %q, true", h)
	}
}

func TestBlockEncodeDecode(t *testing.T) {
	v4 := netip.MustParsePrefix("10.0.16.0/20")
	v6 := netip.MustParsePrefix("fd00::1:2000/116")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(p netip.Prefix, off int) netip.Addr { return blockAddr(p, off) }
	tests := map[string]struct {
		block Block
		want  Block // after the round trip; Version is set by the test
	}{
		"empty block": {
			block: Block{Prefix: v4},
			want:  Block{Prefix: v4},
		},
		"empty maps": {
			block: Block{Prefix: v4, Claims: map[string]*Bitmap{}, Cooldowns: map[netip.Addr]time.Time{}},
			want:  Block{Prefix: v4},
		},
		"one holder": {
			block: Block{Prefix: v4, Claims: map[string]*Bitmap{"h1": btBitmap(0, 1, 7, 8, 63, 64, 4095)}},
			want:  Block{Prefix: v4, Claims: map[string]*Bitmap{"h1": btBitmap(0, 1, 7, 8, 63, 64, 4095)}},
		},
		"two holders": {
			block: Block{Prefix: v4, Claims: map[string]*Bitmap{"h1": btBitmap(0, 1, 2, 3), "node-b/x": btBitmap(10, 2048, 4095)}},
			want:  Block{Prefix: v4, Claims: map[string]*Bitmap{"h1": btBitmap(0, 1, 2, 3), "node-b/x": btBitmap(10, 2048, 4095)}},
		},
		"holder with an empty bitmap is dropped": {
			block: Block{Prefix: v4, Claims: map[string]*Bitmap{"h1": btBitmap(5), "h2": new(Bitmap)}},
			want:  Block{Prefix: v4, Claims: map[string]*Bitmap{"h1": btBitmap(5)}},
		},
		"full bitmap": {
			block: Block{Prefix: v4, Claims: map[string]*Bitmap{"h1": btFull()}},
			want:  Block{Prefix: v4, Claims: map[string]*Bitmap{"h1": btFull()}},
		},
		"refusals of a request, one unreadable dropped": {
			block: Block{Prefix: v4, Requests: map[string]Request{"h2": {Refused: map[int]Refusal{
				3: {State: StateAllocated, Ref: "team-a/db-1"}, 4: {State: StatePending, Ref: "team-a/db-2"},
				5: {State: StateCooldown, Until: t0}, 6: {State: StateFree}}}}},
			want: Block{Prefix: v4, Requests: map[string]Request{"h2": {Refused: map[int]Refusal{
				3: {State: StateAllocated, Ref: "team-a/db-1"}, 4: {State: StatePending, Ref: "team-a/db-2"},
				5: {State: StateCooldown, Until: t0}}}}},
		},
		"cooldowns at first and last offset": {
			block: Block{Prefix: v4, Cooldowns: map[netip.Addr]time.Time{at(v4, 0): t0, at(v4, BlockSize-1): t0.Add(time.Hour)}},
			want:  Block{Prefix: v4, Cooldowns: map[netip.Addr]time.Time{at(v4, 0): t0, at(v4, BlockSize-1): t0.Add(time.Hour)}},
		},
		"sub-second deadlines round up": {
			block: Block{Prefix: v4, Cooldowns: map[netip.Addr]time.Time{
				at(v4, 1): t0.Add(time.Nanosecond),
				at(v4, 2): t0.Add(999 * time.Millisecond),
				at(v4, 3): t0,
				at(v4, 4): t0.Add(1500 * time.Millisecond),
				at(v4, 5): t0.Add(time.Second - time.Nanosecond),
			}},
			want: Block{Prefix: v4, Cooldowns: map[netip.Addr]time.Time{
				at(v4, 1): t0.Add(time.Second),
				at(v4, 2): t0.Add(time.Second),
				at(v4, 3): t0,
				at(v4, 4): t0.Add(2 * time.Second),
				at(v4, 5): t0.Add(time.Second),
			}},
		},
		"deadline before 1970 rounds up": {
			block: Block{Prefix: v4, Cooldowns: map[netip.Addr]time.Time{at(v4, 9): time.Unix(-10, 500_000_000)}},
			want:  Block{Prefix: v4, Cooldowns: map[netip.Addr]time.Time{at(v4, 9): time.Unix(-9, 0)}},
		},
		"deadline in another time zone": {
			block: Block{Prefix: v4, Cooldowns: map[netip.Addr]time.Time{at(v4, 9): t0.In(time.FixedZone("X", -7*3600)).Add(time.Millisecond)}},
			want:  Block{Prefix: v4, Cooldowns: map[netip.Addr]time.Time{at(v4, 9): t0.Add(time.Second)}},
		},
		"version is the store's": {
			block: Block{Prefix: v4, Version: "stale", Claims: map[string]*Bitmap{"h1": btBitmap(1)}},
			want:  Block{Prefix: v4, Claims: map[string]*Bitmap{"h1": btBitmap(1)}},
		},
		"ipv6 block": {
			block: Block{Prefix: v6,
				Claims:    map[string]*Bitmap{"h1": btBitmap(0, 4095), "h2": btBitmap(100)},
				Cooldowns: map[netip.Addr]time.Time{at(v6, 0): t0.Add(time.Microsecond), at(v6, 4095): t0}},
			want: Block{Prefix: v6,
				Claims:    map[string]*Bitmap{"h1": btBitmap(0, 4095), "h2": btBitmap(100)},
				Cooldowns: map[netip.Addr]time.Time{at(v6, 0): t0.Add(time.Second), at(v6, 4095): t0}},
		},
		"ipv4 block at the top of the space": {
			block: Block{Prefix: netip.MustParsePrefix("255.255.240.0/20"),
				Cooldowns: map[netip.Addr]time.Time{netip.MustParseAddr("255.255.255.255"): t0}},
			want: Block{Prefix: netip.MustParsePrefix("255.255.240.0/20"),
				Cooldowns: map[netip.Addr]time.Time{netip.MustParseAddr("255.255.255.255"): t0}},
		},
		"claimed and cooling down": {
			block: Block{Prefix: v4, Claims: map[string]*Bitmap{"h1": btFull()}, Cooldowns: map[netip.Addr]time.Time{at(v4, 77): t0}},
			want:  Block{Prefix: v4, Claims: map[string]*Bitmap{"h1": btFull()}, Cooldowns: map[netip.Addr]time.Time{at(v4, 77): t0}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			const version = "rv-42"
			orig := tc.block.Clone()
			e := tc.block.Encode()
			if btDiff(tc.block, orig) != "" {
				t.Fatalf("Encode changed its block")
			}
			// Through JSON, as a store would keep it.
			raw, err := json.Marshal(e)
			if err != nil {
				t.Fatal(err)
			}
			var e2 EncodedBlock
			if err := json.Unmarshal(raw, &e2); err != nil {
				t.Fatal(err)
			}
			got, err := e2.Decode(version)
			if err != nil {
				t.Fatalf("Decode(%s): %v", raw, err)
			}
			want := tc.want
			want.Version = version
			if d := btDiff(got, want); d != "" {
				t.Fatalf("Decode(Encode(b)): %s\nencoded: %s", d, raw)
			}
			// Encoding is canonical: the decoded block encodes the same.
			if again := btJSON(t, got.Encode()); again != string(raw) {
				t.Fatalf("re-encoded %s, first encoded %s", again, raw)
			}
		})
	}
}

// TestBlockEncodedFormat pins the persisted format documented on
// EncodedBlock.
func TestBlockEncodedFormat(t *testing.T) {
	p := netip.MustParsePrefix("10.0.0.0/20")
	b := Block{
		Prefix: p,
		Claims: map[string]*Bitmap{"a": btBitmap(0), "b": btBitmap(0, 9), "none": new(Bitmap)},
		Cooldowns: map[netip.Addr]time.Time{
			netip.MustParseAddr("10.0.15.255"): time.Date(2026, 1, 1, 0, 0, 0, 1, time.UTC), // rounds up to ...601
			netip.MustParseAddr("10.0.0.1"):    time.Unix(1, 0),
		},
	}
	raw, err := json.Marshal(b.Encode())
	if err != nil {
		t.Fatal(err)
	}
	// Bit i of byte j is offset 8j+i, trailing zero bytes trimmed; cooldown
	// records are sorted by offset: uint16 offset, int64 seconds.
	const want = `{"prefix":"10.0.0.0/20","claims":{"a":"AQ==","b":"AQI="},"cooldowns":"AAEAAAAAAAAAAQ//AAAAAGlVuQE="}`
	if string(raw) != want {
		t.Fatalf("encoded\n%s\nwant\n%s", raw, want)
	}
	raw, err = json.Marshal(Block{Prefix: netip.MustParsePrefix("fd00::/116")}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"prefix":"fd00::/116"}`; string(raw) != want {
		t.Fatalf("empty block encoded as %s, want %s", raw, want)
	}
}

// TestBlockEncodedSize documents that a block stays far below the 256 KiB
// object limit, even at its largest.
func TestBlockEncodedSize(t *testing.T) {
	p := netip.MustParsePrefix("10.128.240.0/20")
	holder := "vmipam-controller-5f7d9c6b8-x2kqz" // a realistic pod name
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	claimed := Block{Prefix: p, Claims: map[string]*Bitmap{holder: btFull()}}
	cooling := claimed.Clone()
	cooling.Cooldowns = make(map[netip.Addr]time.Time, BlockSize)
	for off := range BlockSize {
		cooling.Cooldowns[blockAddr(p, off)] = t0.Add(time.Duration(off)*time.Second + 500*time.Millisecond)
	}
	tests := map[string]struct {
		block Block
		limit int
	}{
		"every address claimed and cooling down": {cooling, 64 << 10},
		"every address claimed":                  {claimed, 1 << 10},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			raw, err := json.Marshal(tc.block.Encode())
			if err != nil {
				t.Fatal(err)
			}
			if len(raw) >= tc.limit {
				t.Fatalf("encoded size %d bytes, want under %d", len(raw), tc.limit)
			}
			var e EncodedBlock
			if err := json.Unmarshal(raw, &e); err != nil {
				t.Fatal(err)
			}
			got, err := e.Decode("1")
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Cooldowns) != len(tc.block.Cooldowns) || *got.Claims[holder] != *btFull() {
				t.Fatalf("round trip lost data: %d cooldowns, want %d", len(got.Cooldowns), len(tc.block.Cooldowns))
			}
		})
	}
}

func TestBlockDecodeErrors(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString
	record := func(off uint16, secs int64) []byte {
		r := binary.BigEndian.AppendUint16(nil, off)
		return binary.BigEndian.AppendUint64(r, uint64(secs))
	}
	const blk = "10.0.0.0/20"
	tests := map[string]struct {
		e    EncodedBlock
		want []string // substrings; each case must also name the block
	}{
		"not a prefix":         {EncodedBlock{Prefix: "nonsense"}, []string{`"nonsense"`, "block-aligned /20 (IPv4) or /116 (IPv6)"}},
		"empty prefix":         {EncodedBlock{Prefix: ""}, []string{`""`, "block-aligned"}},
		"address only":         {EncodedBlock{Prefix: "10.0.0.0"}, []string{`"10.0.0.0"`}},
		"ipv4 /24":             {EncodedBlock{Prefix: "10.0.0.0/24"}, []string{`"10.0.0.0/24"`, "/20"}},
		"ipv4 /16":             {EncodedBlock{Prefix: "10.0.0.0/16"}, []string{`"10.0.0.0/16"`}},
		"ipv6 /64":             {EncodedBlock{Prefix: "fd00::/64"}, []string{`"fd00::/64"`, "/116"}},
		"ipv6 /20":             {EncodedBlock{Prefix: "fd00::/20"}, []string{`"fd00::/20"`}},
		"not aligned":          {EncodedBlock{Prefix: "10.0.1.0/20"}, []string{`"10.0.1.0/20"`, "block-aligned"}},
		"ipv6 not aligned":     {EncodedBlock{Prefix: "fd00::1:2345/116"}, []string{`"fd00::1:2345/116"`}},
		"claims not base64":    {EncodedBlock{Prefix: blk, Claims: map[string]string{"h1": "!!!"}}, []string{`holder "h1"`, "base64"}},
		"claims unpadded":      {EncodedBlock{Prefix: blk, Claims: map[string]string{"h1": "AQ"}}, []string{`holder "h1"`}},
		"claims too long":      {EncodedBlock{Prefix: blk, Claims: map[string]string{"h1": b64(make([]byte, BlockSize/8+1))}}, []string{"at most 512 bytes"}},
		"cooldowns not base64": {EncodedBlock{Prefix: blk, Cooldowns: "%%%"}, []string{"cooldowns", "10-byte records"}},
		"cooldown record short": {
			EncodedBlock{Prefix: blk, Cooldowns: b64(record(1, 1)[:9])}, []string{"cooldowns", "10-byte records"},
		},
		"cooldown record long": {
			EncodedBlock{Prefix: blk, Cooldowns: b64(append(record(1, 1), 0))}, []string{"10-byte records"},
		},
		"cooldown records truncated": {
			EncodedBlock{Prefix: blk, Cooldowns: b64(append(record(1, 1), record(2, 2)[:5]...))}, []string{"10-byte records"},
		},
		"cooldown offset outside the block": {
			EncodedBlock{Prefix: blk, Cooldowns: b64(append(record(1, 1), record(BlockSize, 1)...))}, []string{"offset 4096 is outside the block"},
		},
		"cooldown offset max": {
			EncodedBlock{Prefix: "fd00::/116", Cooldowns: b64(record(0xffff, 1))}, []string{"fd00::/116", "offset 65535"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			b, err := tc.e.Decode("1")
			if err == nil {
				t.Fatalf("Decode succeeded: %+v", b)
			}
			msg := err.Error()
			if !strings.Contains(msg, "decode block") || !strings.Contains(msg, tc.e.Prefix) {
				t.Errorf("error does not name block %q: %s", tc.e.Prefix, msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error does not contain %q: %s", w, msg)
				}
			}
		})
	}
}

func FuzzDecodeBlock(f *testing.F) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	v4, v6 := netip.MustParsePrefix("10.0.16.0/20"), netip.MustParsePrefix("fd00::1:2000/116")
	for _, b := range []Block{
		{Prefix: v4},
		{Prefix: v4, Claims: map[string]*Bitmap{"h1": btBitmap(0, 9, 4095)}, Cooldowns: map[netip.Addr]time.Time{blockAddr(v4, 3): t0}},
		{Prefix: v6, Claims: map[string]*Bitmap{"h2": btFull()}, Cooldowns: map[netip.Addr]time.Time{blockAddr(v6, 4095): t0, blockAddr(v6, 0): time.Unix(-1, 0)}},
	} {
		e := b.Encode()
		h, c := "", ""
		for holder, claims := range e.Claims { // at most one
			h, c = holder, claims
		}
		f.Add(e.Prefix, h, c, e.Cooldowns)
	}
	f.Add("10.0.1.0/20", "h", "AQ==", "")
	f.Add("::ffff:10.0.0.0/116", "h", "AQI=", "AAEAAAAAAAAAAQ==")
	f.Add("10.0.0.0/20", "", "", "EAAAAAAAAAAAAQ==")
	f.Add("10.0.0.0/20", "h", "AAAA", "//////////////8=")
	f.Add("10.0.0.0/20", "h", "!!", "AAEAAAAAAAAAAQ")
	f.Fuzz(func(t *testing.T, prefix, holder, claims, cooldowns string) {
		e := EncodedBlock{Prefix: prefix, Cooldowns: cooldowns}
		if holder != "" || claims != "" {
			e.Claims = map[string]string{holder: claims}
		}
		b, err := e.Decode("v1")
		if err != nil {
			if !strings.Contains(err.Error(), "decode block") {
				t.Fatalf("error does not name the block: %v", err)
			}
			return
		}
		if b.Version != "v1" {
			t.Fatalf("Version = %q, want v1", b.Version)
		}
		if b.Prefix.Bits() != b.Prefix.Addr().BitLen()-BlockBits || b.Prefix.Masked() != b.Prefix {
			t.Fatalf("decoded prefix %v is not a block", b.Prefix)
		}
		for a := range b.Cooldowns {
			if !b.Prefix.Contains(a) {
				t.Fatalf("cooldown address %v outside block %v", a, b.Prefix)
			}
		}
		e2 := b.Encode()
		b2, err := e2.Decode("v1")
		if err != nil {
			t.Fatalf("re-encoded block %+v does not decode: %v", e2, err)
		}
		if d := btDiff(b2, b); d != "" {
			t.Fatalf("Decode(Encode(b)) != b: %s\nencoded: %+v", d, e2)
		}
		raw := btJSON(t, e2)
		if !utf8.ValidString(holder) {
			// JSON replaces invalid UTF-8 in the holder name with U+FFFD,
			// so only the in-memory round trip above holds.
			return
		}
		var e3 EncodedBlock
		if err := json.Unmarshal([]byte(raw), &e3); err != nil {
			t.Fatal(err)
		}
		b3, err := e3.Decode("v1")
		if err != nil {
			t.Fatalf("re-encoded block %s does not decode: %v", raw, err)
		}
		if d := btDiff(b3, b); d != "" {
			t.Fatalf("Decode(JSON(Encode(b))) != b: %s\nencoded: %s", d, raw)
		}
		// Encoding is canonical: the same block always encodes the same.
		if again := btJSON(t, b3.Encode()); again != raw {
			t.Fatalf("encoding is not canonical: %s then %s", raw, again)
		}
	})
}
