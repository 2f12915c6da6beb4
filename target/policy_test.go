package target

import (
	"encoding/json"
	"testing"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
)

// admit runs t's policy on an admission as the API server would: the
// variables first, then every rule; it returns the messages of the rules
// that fail. Fields missing from an object read as absent, as in the API
// server.
func admit(t *testing.T, tg Target, op, obj, old string) []string {
	t.Helper()
	env, err := cel.NewEnv(cel.Variable("object", cel.DynType), cel.Variable("oldObject", cel.DynType),
		cel.Variable("request", cel.DynType), cel.Variable("variables", cel.DynType), ext.Strings())
	if err != nil {
		t.Fatal(err)
	}
	decode := func(s string) any {
		if s == "" {
			return nil
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	in := map[string]any{"object": decode(obj), "oldObject": decode(old), "request": map[string]any{"operation": op}}
	eval := func(expr string) any {
		ast, iss := env.Compile(expr)
		if iss.Err() != nil {
			t.Fatalf("compile %s: %v", expr, iss.Err())
		}
		prg, err := env.Program(ast)
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := prg.Eval(in)
		if err != nil {
			return err
		}
		return out.Value()
	}
	vars, rules := tg.PolicyRules()
	// Variables are lazy in the API server: one that reads oldObject on a
	// CREATE fails, and only matters to a rule that reads it there.
	values := map[string]any{}
	for _, v := range vars {
		values[v.Name] = eval(v.Expression)
		if _, failed := values[v.Name].(error); failed {
			values[v.Name] = nil
		}
	}
	in["variables"] = values
	var failed []string
	for _, r := range rules {
		if ok, _ := eval(r.Expression).(bool); !ok {
			failed = append(failed, r.Message)
		}
	}
	return failed
}

var kubevirtLike = Target{AddressAnnotation: "cni.projectcalico.org/ipAddrs", AnnotationPath: []string{"spec", "template", "metadata"}, AnnotationFormat: FormatJSON}

var neonLike = Target{Status: &StatusFields{Address: []string{"status", "extraNetIP"}, RequestAnnotation: DefaultRequestAnnotation}}

func TestPolicyRules(t *testing.T) {
	stamp := func(addr string) string {
		return `"annotations":{"vmipam.io/token":"t","vmipam.io/pool":"p","vmipam.io/address":"` + addr + `"}`
	}
	vm := func(meta, addrs string) string {
		return `{"metadata":{` + meta + `},"spec":{"addresses":` + addrs + `}}`
	}
	kv := func(meta, ann string) string {
		return `{"metadata":{` + meta + `},"spec":{"template":{"metadata":{"annotations":{"cni.projectcalico.org/ipAddrs":` + ann + `}}}}}`
	}
	neon := func(meta, ip string) string {
		return `{"metadata":{` + meta + `},"status":{"extraNetIP":"` + ip + `"}}`
	}
	tests := map[string]struct {
		target   Target
		op       string
		obj, old string
		denied   bool
	}{
		"vm create, stamped":                     {VirtualMachine, "CREATE", vm(stamp("10.0.0.5"), `["10.0.0.5"]`), "", false},
		"vm create, changed by a later webhook":  {VirtualMachine, "CREATE", vm(stamp("10.0.0.5"), `["10.0.0.6"]`), "", true},
		"vm create, address removed":             {VirtualMachine, "CREATE", `{"metadata":{` + stamp("10.0.0.5") + `}}`, "", true},
		"vm create, stamp removed":               {VirtualMachine, "CREATE", vm(`"annotations":{"vmipam.io/token":"t"}`, `["10.0.0.5"]`), "", true},
		"vm create, no token (dry run)":          {VirtualMachine, "CREATE", vm(`"name":"a"`, `["10.0.0.5"]`), "", false},
		"vm update, other field":                 {VirtualMachine, "UPDATE", vm(stamp("10.0.0.5")+`,"labels":{"a":"b"}`, `["10.0.0.5"]`), vm(stamp("10.0.0.5"), `["10.0.0.5"]`), false},
		"vm update, address changed":             {VirtualMachine, "UPDATE", vm(stamp("10.0.0.5"), `["10.0.0.6"]`), vm(stamp("10.0.0.5"), `["10.0.0.5"]`), true},
		"vm update, address removed":             {VirtualMachine, "UPDATE", vm(stamp("10.0.0.5"), `[]`), vm(stamp("10.0.0.5"), `["10.0.0.5"]`), true},
		"vm update, token changed":               {VirtualMachine, "UPDATE", vm(`"annotations":{"vmipam.io/token":"x","vmipam.io/pool":"p","vmipam.io/address":"10.0.0.5"}`, `["10.0.0.5"]`), vm(stamp("10.0.0.5"), `["10.0.0.5"]`), true},
		"vm update, stamps removed":              {VirtualMachine, "UPDATE", vm(`"name":"a"`, `["10.0.0.5"]`), vm(stamp("10.0.0.5"), `["10.0.0.5"]`), true},
		"vm update, address added by the user":   {VirtualMachine, "UPDATE", vm(`"name":"a"`, `["10.0.0.5"]`), vm(`"name":"a"`, `[]`), true},
		"vm update, address added with a stamp":  {VirtualMachine, "UPDATE", vm(stamp("10.0.0.5"), `["10.0.0.5"]`), vm(`"name":"a"`, `[]`), false},
		"vm update, added, stamp mismatched":     {VirtualMachine, "UPDATE", vm(stamp("10.0.0.5"), `["10.0.0.6"]`), vm(`"name":"a"`, `[]`), true},
		"kubevirt create, stamped":               {kubevirtLike, "CREATE", kv(stamp("10.0.0.5"), `"[\"10.0.0.5\"]"`), "", false},
		"kubevirt create, respelled":             {kubevirtLike, "CREATE", kv(stamp("10.0.0.5"), `"[ \"10.0.0.5\" ]"`), "", true},
		"kubevirt create, changed":               {kubevirtLike, "CREATE", kv(stamp("10.0.0.5"), `"[\"10.0.0.6\"]"`), "", true},
		"kubevirt update, annotation changed":    {kubevirtLike, "UPDATE", kv(stamp("10.0.0.5"), `"[\"10.0.0.6\"]"`), kv(stamp("10.0.0.5"), `"[\"10.0.0.5\"]"`), true},
		"kubevirt update, template left alone":   {kubevirtLike, "UPDATE", kv(stamp("10.0.0.5")+`,"labels":{"a":"b"}`, `"[\"10.0.0.5\"]"`), kv(stamp("10.0.0.5"), `"[\"10.0.0.5\"]"`), false},
		"kubevirt update, template dropped":      {kubevirtLike, "UPDATE", `{"metadata":{` + stamp("10.0.0.5") + `},"spec":{}}`, kv(stamp("10.0.0.5"), `"[\"10.0.0.5\"]"`), true},
		"neon create, stamped, no status":        {neonLike, "CREATE", `{"metadata":{` + stamp("10.0.0.5") + `}}`, "", false},
		"neon create, stamp removed":             {neonLike, "CREATE", `{"metadata":{"annotations":{"vmipam.io/token":"t"}}}`, "", true},
		"neon status filled by vmipam":           {neonLike, "UPDATE", neon(stamp("10.0.0.5"), "10.0.0.5"), `{"metadata":{` + stamp("10.0.0.5") + `}}`, false},
		"neon status filled by its own IPAM":     {neonLike, "UPDATE", neon(stamp("10.0.0.5"), "10.0.9.9"), `{"metadata":{` + stamp("10.0.0.5") + `}}`, true},
		"neon status changed after the fill":     {neonLike, "UPDATE", neon(stamp("10.0.0.5"), "10.0.0.6"), neon(stamp("10.0.0.5"), "10.0.0.5"), true},
		"neon status cleared":                    {neonLike, "UPDATE", neon(stamp("10.0.0.5"), ""), neon(stamp("10.0.0.5"), "10.0.0.5"), true},
		"neon out of scope, its own IPAM writes": {neonLike, "UPDATE", neon(`"name":"a"`, "10.0.9.9"), neon(`"name":"a"`, ""), false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			failed := admit(t, tc.target, tc.op, tc.obj, tc.old)
			if tc.denied != (len(failed) > 0) {
				t.Errorf("denied: %v (%q), want denied %v", len(failed) > 0, failed, tc.denied)
			}
		})
	}
}
