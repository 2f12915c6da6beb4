package memlimit

import (
	"math"
	"runtime/debug"
	"testing"
	"testing/fstest"
)

// TestCgroup: the limit is read where cgroup v2 or v1 keeps it, for the
// process's own cgroup or at the root of a container's namespace; no limit
// ("max", v1's unlimited value, no file) reads as none.
func TestCgroup(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	tests := map[string]struct {
		fs     fstest.MapFS
		want   int64
		wantOK bool
	}{
		"v2, in a cgroup namespace": {fs: fstest.MapFS{
			"proc/self/cgroup": file("0::/\n"), "sys/fs/cgroup/memory.max": file("536870912\n"),
		}, want: 536870912, wantOK: true},
		"v2, the process's own cgroup": {fs: fstest.MapFS{
			"proc/self/cgroup":                          file("0::/kubepods/pod1/c1\n"),
			"sys/fs/cgroup/kubepods/pod1/c1/memory.max": file("268435456\n"),
			"sys/fs/cgroup/memory.max":                  file("max\n"),
		}, want: 268435456, wantOK: true},
		"v2, no limit": {fs: fstest.MapFS{
			"proc/self/cgroup": file("0::/\n"), "sys/fs/cgroup/memory.max": file("max\n"),
		}},
		"v1": {fs: fstest.MapFS{
			"proc/self/cgroup": file("12:cpu,cpuacct:/x\n4:memory:/kubepods/pod1\n"),
			"sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes": file("1073741824\n"),
		}, want: 1073741824, wantOK: true},
		"v1, unlimited": {fs: fstest.MapFS{
			"proc/self/cgroup": file("4:memory:/\n"), "sys/fs/cgroup/memory/memory.limit_in_bytes": file("9223372036854771712\n"),
		}},
		"hybrid: v2 without the memory controller, v1 with it": {fs: fstest.MapFS{
			"proc/self/cgroup": file("4:memory:/p\n0::/\n"), "sys/fs/cgroup/memory/p/memory.limit_in_bytes": file("2097152\n"),
		}, want: 2097152, wantOK: true},
		"nothing to read":   {fs: fstest.MapFS{}},
		"not a number":      {fs: fstest.MapFS{"sys/fs/cgroup/memory.max": file("lots\n")}},
		"no /proc, v2 root": {fs: fstest.MapFS{"sys/fs/cgroup/memory.max": file("1048576")}, want: 1048576, wantOK: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := Cgroup(tc.fs)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("Cgroup = %d, %v; want %d, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// TestSet: the runtime's limit becomes the share asked for of the cgroup's;
// a ratio of 0, GOMEMLIMIT in the environment, or no cgroup limit leave it
// alone; a ratio outside 0 to 1 is refused.
func TestSet(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	fsys := fstest.MapFS{"proc/self/cgroup": {Data: []byte("0::/\n")}, "sys/fs/cgroup/memory.max": {Data: []byte("1000000000\n")}}
	tests := map[string]struct {
		ratio    float64
		env      string
		fs       fstest.MapFS
		want     int64
		wantErr  bool
		wantsSet bool
	}{
		"nine tenths":      {ratio: 0.9, fs: fsys, want: 900000000, wantsSet: true},
		"off":              {ratio: 0, fs: fsys},
		"GOMEMLIMIT wins":  {ratio: 0.9, env: "300MiB", fs: fsys},
		"no cgroup limit":  {ratio: 0.9, fs: fstest.MapFS{}},
		"a ratio above 1":  {ratio: 1.5, fs: fsys, wantErr: true},
		"a negative ratio": {ratio: -0.1, fs: fsys, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv("GOMEMLIMIT", tc.env)
			debug.SetMemoryLimit(math.MaxInt64)
			set, _, err := Set(tc.fs, tc.ratio)
			if (err != nil) != tc.wantErr || set != tc.want {
				t.Fatalf("Set = %d, %v; want %d (error %v)", set, err, tc.want, tc.wantErr)
			}
			got := debug.SetMemoryLimit(-1)
			if tc.wantsSet && got != tc.want || !tc.wantsSet && got != math.MaxInt64 {
				t.Errorf("the runtime's limit is %d", got)
			}
		})
	}
}
