package ctl

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

func TestExhaustion(t *testing.T) {
	hour := metav1.Duration{Duration: time.Hour}
	tests := map[string]struct {
		usable, allocated, pending int64
		trend                      *vmipamv1.Trend
		want                       string // "" for nil
	}{
		"no trend":                  {usable: 100, trend: nil},
		"empty window":              {usable: 100, trend: &vmipamv1.Trend{Change: 5}},
		"shrinking":                 {usable: 100, allocated: 50, trend: &vmipamv1.Trend{Window: hour, Change: -3}},
		"flat":                      {usable: 100, allocated: 50, trend: &vmipamv1.Trend{Window: hour, Change: 0}},
		"10 an hour, 50 left":       {usable: 100, allocated: 40, pending: 10, trend: &vmipamv1.Trend{Window: hour, Change: 10}, want: "5h0m0s"},
		"half window":               {usable: 100, allocated: 90, trend: &vmipamv1.Trend{Window: metav1.Duration{Duration: 30 * time.Minute}, Change: 5}, want: "1h0m0s"},
		"nothing left: exhausted":   {usable: 10, allocated: 8, pending: 2, trend: &vmipamv1.Trend{Window: hour, Change: 1}, want: "0s"},
		"over-full: exhausted":      {usable: 10, allocated: 12, trend: &vmipamv1.Trend{Window: hour, Change: 1}, want: "0s"},
		"a /16 at one an hour":      {usable: 1 << 16, trend: &vmipamv1.Trend{Window: hour, Change: 1}, want: (time.Duration(1<<16) * time.Hour).String()},
		"beyond a Duration: capped": {usable: 1 << 62, trend: &vmipamv1.Trend{Window: hour, Change: 1}, want: (maxDuration / time.Second * time.Second).String()},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got := exhaustion(tt.usable, tt.allocated, tt.pending, tt.trend)
			switch {
			case got == nil && tt.want != "":
				t.Errorf("exhaustion = nil, want %s", tt.want)
			case got != nil && got.String() != tt.want:
				t.Errorf("exhaustion = %s, want %q", got, tt.want)
			}
		})
	}
}

func TestPoolRows(t *testing.T) {
	trend := &vmipamv1.Trend{Window: metav1.Duration{Duration: time.Hour}, Change: 4}
	p := &vmipamv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "dual"},
		Spec: vmipamv1.IPPoolSpec{Paused: true, Ranges: []vmipamv1.IPRange{{CIDR: "10.0.0.0/24"}, {CIDR: "fd00::/120"}}},
		Status: vmipamv1.IPPoolStatus{Usable: 507, Allocated: 3, Trend: trend,
			Conditions: []metav1.Condition{{Type: vmipamv1.ConditionReady, Status: metav1.ConditionTrue}},
			Families: []vmipamv1.FamilyStatus{
				{Family: vmipamv1.IPv4, Usable: 253, Allocated: 2, Pending: 1, Free: 10, Cooldown: 4, Trend: trend},
				{Family: vmipamv1.IPv6, Usable: 254, Allocated: 1},
			}}}
	rows := poolRows(p)
	if len(rows) != 2 {
		t.Fatalf("got %d rows, want one per family: %+v", len(rows), rows)
	}
	v4 := rows[0]
	if v4.Family != "IPv4" || !v4.Ready || !v4.Paused || v4.Usable != 253 || v4.Allocated != 2 || v4.Pending != 1 || v4.Free != 10 || v4.Cooldown != 4 {
		t.Errorf("IPv4 row = %+v", v4)
	}
	if v4.Exhaustion == nil || *v4.Exhaustion != 250*time.Hour/4 {
		t.Errorf("IPv4 exhaustion = %v, want 62h30m", v4.Exhaustion)
	}
	if rows[1].Exhaustion != nil || rows[1].Window != 0 {
		t.Errorf("IPv6 row without a trend = %+v, want no exhaustion", rows[1])
	}
	cells := poolTable(rows)
	if got := strings.Join(cells[0], " "); got != "dual IPv4 true true 253 2 1 4 10 +4/1h 2d14h" {
		t.Errorf("IPv4 cells = %q", got)
	}
	p.Status.Families = nil
	p.Spec.Paused = false
	p.Status.Conditions = nil
	rows = poolRows(p)
	if len(rows) != 1 || rows[0].Family != "IPv4" || rows[0].Ready || rows[0].Paused || rows[0].Usable != 507 {
		t.Errorf("single row = %+v", rows)
	}
}

func TestParseWhen(t *testing.T) {
	now := time.Date(2026, 3, 1, 14, 0, 0, 0, time.UTC)
	tests := map[string]struct {
		in      string
		want    time.Time
		wantErr string
	}{
		"RFC 3339 UTC":       {in: "2026-02-24T14:00:00Z", want: time.Date(2026, 2, 24, 14, 0, 0, 0, time.UTC)},
		"RFC 3339 offset":    {in: "2026-02-24T15:00:00+01:00", want: time.Date(2026, 2, 24, 14, 0, 0, 0, time.UTC)},
		"hours back":         {in: "2h", want: now.Add(-2 * time.Hour)},
		"minutes back":       {in: "90m", want: now.Add(-90 * time.Minute)},
		"days back":          {in: "3d", want: now.Add(-72 * time.Hour)},
		"weeks, days, hours": {in: "1w2d3h", want: now.Add(-(9*24 + 3) * time.Hour)},
		"zero":               {in: "0s", want: now},
		"empty":              {in: "", wantErr: "--since is empty"},
		"date only":          {in: "2026-02-24", wantErr: `--since "2026-02-24": want an RFC 3339 time`},
		"negative":           {in: "-2h", wantErr: "want an RFC 3339 time"},
		"words":              {in: "yesterday", wantErr: "want an RFC 3339 time"},
		"days not a number":  {in: "xd", wantErr: "want an RFC 3339 time"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseWhen("since", tt.in, now)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseWhen(%q) error = %v, want it to contain %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil || !got.Equal(tt.want) {
				t.Errorf("parseWhen(%q) = %s, %v; want %s", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestReleaseFlags(t *testing.T) {
	tests := map[string]struct {
		f       releaseFlags
		wantErr string
	}{
		"plain":                        {f: releaseFlags{timeout: time.Second}},
		"skip with reason":             {f: releaseFlags{skipCooldown: true, reason: "INC-1", timeout: time.Second}},
		"reason alone":                 {f: releaseFlags{reason: "why", timeout: time.Second}},
		"skip without reason":          {f: releaseFlags{skipCooldown: true, timeout: time.Second}, wantErr: "--skip-cooldown needs --reason"},
		"reason longer than the CRD's": {f: releaseFlags{reason: strings.Repeat("x", maxReason+1), timeout: time.Second}, wantErr: "at most 512"},
		"no timeout":                   {f: releaseFlags{}, wantErr: "--timeout"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			err := tt.f.check()
			if (err != nil) != (tt.wantErr != "") || err != nil && !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("check() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestSelectRecords(t *testing.T) {
	addr := netip.MustParseAddr("10.100.0.42")
	at := func(h int) time.Time { return time.Date(2026, 3, 1, h, 0, 0, 0, time.UTC) }
	mt := func(h int) *metav1.Time { t := metav1.NewTime(at(h)); return &t }
	rec := func(name string, from, to int, ended string) vmipamv1.AddressRecord {
		r := vmipamv1.AddressRecord{Address: addr.String(), Name: name, Namespace: "ns", UID: "uid-" + name, To: *mt(to), Ended: ended}
		if from >= 0 {
			r.From = mt(from)
		}
		return r
	}
	// Newest first, as history.Read returns them.
	recs := []vmipamv1.AddressRecord{
		rec("release", -1, 12, vmipamv1.EndedPending),
		rec("c", 9, 11, vmipamv1.EndedAllocated),
		rec("b", -1, 8, vmipamv1.EndedVanished),
		rec("a", 2, 5, vmipamv1.EndedAllocated),
	}
	live := []Holding{{Kind: "VirtualMachine.vmipam.io", Namespace: "ns", Name: "d", UID: "uid-d", Created: at(13)}}
	now := at(15)
	names := func(rs []vmipamv1.AddressRecord) string {
		var out []string
		for _, r := range rs {
			out = append(out, r.Name)
		}
		return strings.Join(out, ",")
	}
	tests := map[string]struct {
		since, at time.Time
		want      string
	}{
		"all, live first":                    {want: "d,release,c,b,a"},
		"since 9: what ended at or after":    {since: at(9), want: "d,release,c"},
		"since 11: the end itself":           {since: at(11), want: "d,release,c"},
		"at 10: the tenure covering it":      {at: at(10), want: "c"},
		"at 3":                               {at: at(3), want: "a"},
		"at 5: a's end, b's unseen start":    {at: at(5), want: "b"},
		"at 4: b started after a ended":      {at: at(4), want: "a"},
		"at 7: from unknown, until 8":        {at: at(7), want: "b"},
		"at 14: the live object":             {at: at(14), want: "d"},
		"at 12: the release is no tenure":    {at: at(12), want: ""},
		"at 16: after now, not the live one": {at: at(16), want: ""},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got := selectRecords(addr, slices.Clone(recs), slices.Clone(live), tt.since, tt.at, now)
			if names(got) != tt.want {
				t.Errorf("selected %q, want %q", names(got), tt.want)
			}
			for _, r := range got {
				if r.Name == "d" && (r.Ended != EndedLive || !r.To.Time.Equal(now) || r.From == nil || !r.From.Time.Equal(at(13))) {
					t.Errorf("live tenure = %+v, want from its creation to now, ended Live", r)
				}
			}
		})
	}
}

func TestHistoryRows(t *testing.T) {
	to := metav1.NewTime(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	plain := []vmipamv1.AddressRecord{{Address: "10.0.0.1", Kind: "VirtualMachine.vmipam.io", Namespace: "ns", Name: "a", UID: "u", To: to, Ended: vmipamv1.EndedAllocated}}
	if h := historyHeader(plain); len(h) != 6 {
		t.Errorf("header without releases = %v, want six columns", h)
	}
	if got := strings.Join(historyRows(plain)[0], " "); got != "- 2026-03-01T12:00:00Z Allocated VirtualMachine.vmipam.io ns/a u" {
		t.Errorf("row = %q", got)
	}
	withRelease := append(plain, vmipamv1.AddressRecord{Address: "10.0.0.1", To: to, Ended: vmipamv1.EndedCooldown, ReleasedBy: "alice", Reason: "INC-1"})
	if h := historyHeader(withRelease); !slices.Equal(h[6:], []string{"RELEASED-BY", "REASON"}) {
		t.Errorf("header with a release = %v", h)
	}
	if got := strings.Join(historyRows(withRelease)[1], " "); got != "- 2026-03-01T12:00:00Z Cooldown - - - alice INC-1" {
		t.Errorf("release row = %q", got)
	}
}
