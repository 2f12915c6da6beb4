package kinds

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestParse(t *testing.T) {
	head := "apiVersion: vmipam.io/v1alpha1\nkind: KindsConfiguration\nkinds:\n"
	kind := func(rest string) string {
		return head + "- {group: example.com, version: v1, kind: Box, resource: boxes, " + rest + "}\n"
	}
	tests := map[string]struct {
		config string
		// wantErr lists what the error must say; none means it parses.
		wantErr []string
	}{
		"list field":          {config: kind("address: {field: spec.addresses}")},
		"string field":        {config: kind("address: {field: spec.net.ip, type: string}, pool: {field: spec.net.pool}")},
		"nested annotation":   {config: kind("address: {annotation: {path: spec.template.metadata, key: example.com/ip, format: json}}, pool: {annotation: example.com/pool}")},
		"status":              {config: kind("address: {status: {address: status.ip, mask: status.mask}}")},
		"condition":           {config: kind("condition: 'has(object.spec.net) && object.spec.net.on', address: {field: spec.addresses}")},
		"network field":       {config: kind("address: {field: spec.addresses}, network: {field: spec.network}")},
		"network annotation":  {config: kind("address: {annotation: {path: spec.template.metadata, key: example.com/ip}}, network: {annotation: {path: spec.template.metadata, key: example.com/net}}")},
		"network, both":       {config: kind("address: {field: spec.addresses}, network: {field: spec.network, annotation: {key: a.io/net}}"), wantErr: []string{"kinds[0].network", "exactly one"}},
		"network, neither":    {config: kind("address: {field: spec.addresses}, network: {}"), wantErr: []string{"kinds[0].network", "exactly one"}},
		"network in address":  {config: kind("address: {field: spec.net.addresses}, network: {field: spec.net}"), wantErr: []string{"kinds[0].network.field", "must not hold, or lie inside, address.field"}},
		"network is address":  {config: kind("address: {annotation: {key: a.io/ip}}, network: {annotation: {key: a.io/ip}}"), wantErr: []string{"kinds[0].network.annotation.key", "is the address's annotation"}},
		"network not json":    {config: kind("address: {field: spec.addresses}, network: {annotation: {key: a.io/net, format: comma}}"), wantErr: []string{"kinds[0].network.annotation.format"}},
		"network in status":   {config: kind("address: {field: spec.addresses}, network: {field: status.net}"), wantErr: []string{"kinds[0].network.field", "must start with spec"}},
		"families":            {config: kind("address: {field: spec.addresses}, families: {policyField: spec.ipFamilyPolicy, field: spec.ipFamilies}")},
		"families of one":     {config: kind("address: {field: spec.ip, type: string}, families: {policyField: spec.policy}"), wantErr: []string{"kinds[0].families", "holds one address"}},
		"families, no policy": {config: kind("address: {field: spec.addresses}, families: {field: spec.ipFamilies}"), wantErr: []string{"kinds[0].families.policyField: Required"}},
		"wrong kind":          {config: "apiVersion: v1\nkind: ConfigMap\nkinds: []\n", wantErr: []string{"kind: Invalid value", "must be apiVersion: vmipam.io/v1alpha1, kind: KindsConfiguration", "kinds: Required value"}},
		"unknown field":       {config: kind("address: {feild: spec.addresses}"), wantErr: []string{`unknown field "feild"`}},
		"no address":          {config: kind("pool: {field: spec.pool}"), wantErr: []string{"kinds[0].address", "exactly one of field, annotation and status"}},
		"two addresses":       {config: kind("address: {field: spec.addresses, status: {address: status.ip}}"), wantErr: []string{"exactly one of"}},
		"field in metadata":   {config: kind("address: {field: metadata.ip}"), wantErr: []string{"kinds[0].address.field", "must start with spec"}},
		"status not status":   {config: kind("address: {status: {address: spec.ip}}"), wantErr: []string{"kinds[0].address.status.address", "must start with status"}},
		"bad path":            {config: kind("address: {field: spec.my-ip}"), wantErr: []string{"dotted path of field names"}},
		"bad format":          {config: kind("address: {annotation: {key: a.io/ip, format: yaml}}"), wantErr: []string{"kinds[0].address.annotation.format", `"yaml"`}},
		"path not metadata":   {config: kind("address: {annotation: {path: spec.template, key: a.io/ip}}"), wantErr: []string{"must name an object's metadata"}},
		"vmipam's annotation": {config: kind("address: {annotation: {key: vmipam.io/token}}"), wantErr: []string{"vmipam's own record"}},
		"bad key":             {config: kind("address: {annotation: {key: 'a b'}}"), wantErr: []string{"kinds[0].address.annotation.key"}},
		"bad condition":       {config: kind("condition: 'object.spec. ==', address: {field: spec.addresses}"), wantErr: []string{"kinds[0].condition", "not a CEL expression"}},
		"condition not bool":  {config: kind("condition: '\"yes\"', address: {field: spec.addresses}"), wantErr: []string{"must be true or false"}},
		"bad scope":           {config: kind("scope: Global, address: {field: spec.addresses}"), wantErr: []string{"kinds[0].scope"}},
		"bad resource":        {config: head + "- {group: a.io, version: v1, kind: A, resource: As, address: {field: spec.addresses}}\n", wantErr: []string{"kinds[0].resource"}},
		"reserved word":       {config: kind("address: {field: spec.in.ip, type: string}"), wantErr: []string{"reserved word of CEL"}},
		"same webhook path": {config: head + "- {group: vm.neon.tech, version: v1, kind: A, resource: as, address: {field: spec.addresses}}\n" +
			"- {group: vm-neon.tech, version: v1, kind: A, resource: as, address: {field: spec.addresses}}\n", wantErr: []string{"kinds[1].group: Duplicate value", "webhook path"}},
		"duplicate": {config: head + "- {group: a.io, version: v1, kind: A, resource: as, address: {field: spec.addresses}}\n" +
			"- {group: a.io, version: v1, kind: A, resource: as, address: {field: spec.addresses}}\n", wantErr: []string{"kinds[1].resource: Duplicate value", "already kinds[0]"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ts, err := Parse([]byte(tc.config))
			if len(tc.wantErr) == 0 {
				if err != nil || len(ts) != 1 {
					t.Fatalf("Parse: %v, %d kinds", err, len(ts))
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", ts)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestShippedConfigs: the configuration in deploy/kinds and its examples
// parse, and the default one is vmipam's own kind exactly.
func TestShippedConfigs(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("..", "deploy", "kinds", "examples", "*.yaml"))
	files = append(files, filepath.Join("..", "deploy", "kinds", "kinds.yaml"))
	for _, f := range files {
		ts, err := Load(f)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if filepath.Base(f) == "kinds.yaml" {
			if len(ts) != 1 || !reflect.DeepEqual(ts[0], VirtualMachine) {
				t.Errorf("%s is not vmipam's own kind: %+v", f, ts)
			}
		}
	}
	if ts, err := LoadOrDefault(""); err != nil || len(ts) != 1 || ts[0].GVR() != VirtualMachine.GVR() {
		t.Errorf("LoadOrDefault without a file: %v, %v; want vmipam's own kind", ts, err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !os.IsNotExist(unwrapAll(err)) {
		t.Errorf("Load of a missing file: %v", err)
	}
}

func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
}

func TestInScope(t *testing.T) {
	neon := Kind{Condition: "has(object.spec.extraNetwork) && has(object.spec.extraNetwork.enable) && object.spec.extraNetwork.enable == true"}
	for _, tc := range []struct {
		obj  string
		want bool
	}{
		{`{"spec":{"extraNetwork":{"enable":true}}}`, true},
		{`{"spec":{"extraNetwork":{"enable":false}}}`, false},
		{`{"spec":{}}`, false},
		{`{}`, false},
		{`{"spec":{"extraNetwork":{"enable":"yes"}}}`, false}, // an error does not match
	} {
		u := &unstructured.Unstructured{}
		if err := json.Unmarshal([]byte(tc.obj), &u.Object); err != nil {
			t.Fatal(err)
		}
		if got := neon.InScope(u); got != tc.want {
			t.Errorf("InScope(%s) = %v, want %v", tc.obj, got, tc.want)
		}
	}
	if !(Kind{}).InScope(&unstructured.Unstructured{Object: map[string]any{}}) {
		t.Error("a kind without a condition must take every object")
	}
}

func TestStatusFill(t *testing.T) {
	neon := Kind{Status: &StatusFields{Address: []string{"status", "extraNetIP"}, Mask: []string{"status", "extraNetMask"}, MaskFormat: MaskDotted}}
	p24, p64 := netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/64")
	for _, tc := range []struct {
		name   string
		tg     Kind
		status map[string]any
		addr   netip.Addr
		prefix netip.Prefix
		want   map[string]any
	}{
		{"empty", neon, nil, netip.MustParseAddr("10.0.0.5"), p24, map[string]any{"status": map[string]any{"extraNetIP": "10.0.0.5", "extraNetMask": "255.255.255.0"}}},
		{"filled", neon, map[string]any{"extraNetIP": "10.0.0.5", "extraNetMask": "255.255.255.0"}, netip.MustParseAddr("10.0.0.5"), p24, nil},
		{"mask missing", neon, map[string]any{"extraNetIP": "10.0.0.5"}, netip.MustParseAddr("10.0.0.5"), p24, map[string]any{"status": map[string]any{"extraNetMask": "255.255.255.0"}}},
		{"IPv6 gets a length", neon, nil, netip.MustParseAddr("fd00::5"), p64, map[string]any{"status": map[string]any{"extraNetIP": "fd00::5", "extraNetMask": "64"}}},
		{"not a status kind", VirtualMachine, nil, netip.MustParseAddr("10.0.0.5"), p24, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := &unstructured.Unstructured{Object: map[string]any{}}
			if tc.status != nil {
				obj.Object["status"] = tc.status
			}
			if got := tc.tg.StatusFill(obj, tc.addr, tc.prefix); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("StatusFill = %v, want %v", got, tc.want)
			}
		})
	}
	if got := FormatMask(netip.MustParsePrefix("10.0.0.0/20"), MaskPrefix); got != "20" {
		t.Errorf("prefix format: %s", got)
	}
}
