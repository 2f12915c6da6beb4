package kinds

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
func admit(t *testing.T, tg Kind, op, obj, old, user string) []string {
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
	groups := []any{"system:authenticated"}
	if user == "admin" {
		groups = append(groups, "system:masters")
	}
	in := map[string]any{"object": decode(obj), "oldObject": decode(old), "request": map[string]any{
		"operation": op, "dryRun": false, "userInfo": map[string]any{"username": user, "groups": groups},
	}}
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
	// The policy of the operation: each has its own, with the variables
	// its rules read.
	vars, rules := tg.Policy(op, Writers{Users: []string{"system:serviceaccount:vmipam-system:vmipam"}, Groups: []string{"system:masters"}})
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

var kubevirtLike = Kind{AddressAnnotation: "cni.projectcalico.org/ipAddrs", AnnotationPath: []string{"spec", "template", "metadata"}, AnnotationFormat: FormatJSON,
	NetworkAnnotation: "vmipam.io/network", NetworkAnnotationPath: []string{"spec", "template", "metadata"}}

var neonLike = Kind{Status: &StatusFields{Address: []string{"status", "extraNetIP"}, RequestAnnotation: DefaultRequestAnnotation},
	Condition: "has(object.spec) && has(object.spec.extraNetwork) && object.spec.extraNetwork.enable == true"}

// vmipamSA is vmipam's ServiceAccount, as the API server names it.
const vmipamSA = "system:serviceaccount:vmipam-system:vmipam"

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
		return `{"metadata":{` + meta + `},"spec":{"extraNetwork":{"enable":true}},"status":{"extraNetIP":"` + ip + `"}}`
	}
	tests := map[string]struct {
		kind     Kind
		op       string
		obj, old string
		denied   bool
		// user is who asks; a user of no special group when empty.
		user string
	}{
		"vm create, stamped":                     {VirtualMachine, "CREATE", vm(stamp("10.0.0.5"), `["10.0.0.5"]`), "", false, ""},
		"vm create, changed by a later webhook":  {VirtualMachine, "CREATE", vm(stamp("10.0.0.5"), `["10.0.0.6"]`), "", true, ""},
		"vm create, address removed":             {VirtualMachine, "CREATE", `{"metadata":{` + stamp("10.0.0.5") + `}}`, "", true, ""},
		"vm create, stamp removed":               {VirtualMachine, "CREATE", vm(`"annotations":{"vmipam.io/token":"t"}`, `["10.0.0.5"]`), "", true, ""},
		"vm create, no token":                    {VirtualMachine, "CREATE", vm(`"name":"a"`, `["10.0.0.5"]`), "", true, ""},
		"vm update, other field":                 {VirtualMachine, "UPDATE", vm(stamp("10.0.0.5")+`,"labels":{"a":"b"}`, `["10.0.0.5"]`), vm(stamp("10.0.0.5"), `["10.0.0.5"]`), false, ""},
		"vm update, address changed":             {VirtualMachine, "UPDATE", vm(stamp("10.0.0.5"), `["10.0.0.6"]`), vm(stamp("10.0.0.5"), `["10.0.0.5"]`), true, ""},
		"vm update, address removed":             {VirtualMachine, "UPDATE", vm(stamp("10.0.0.5"), `[]`), vm(stamp("10.0.0.5"), `["10.0.0.5"]`), true, ""},
		"vm update, token changed":               {VirtualMachine, "UPDATE", vm(`"annotations":{"vmipam.io/token":"x","vmipam.io/pool":"p","vmipam.io/address":"10.0.0.5"}`, `["10.0.0.5"]`), vm(stamp("10.0.0.5"), `["10.0.0.5"]`), true, ""},
		"vm update, stamps removed":              {VirtualMachine, "UPDATE", vm(`"name":"a"`, `["10.0.0.5"]`), vm(stamp("10.0.0.5"), `["10.0.0.5"]`), true, ""},
		"vm update, address added by the user":   {VirtualMachine, "UPDATE", vm(`"name":"a"`, `["10.0.0.5"]`), vm(`"name":"a"`, `[]`), true, ""},
		"vm update, address added with a stamp":  {VirtualMachine, "UPDATE", vm(stamp("10.0.0.5"), `["10.0.0.5"]`), vm(`"name":"a"`, `[]`), false, vmipamSA},
		"vm update, stamp forged by a user":      {VirtualMachine, "UPDATE", vm(stamp("10.0.0.5"), `["10.0.0.5"]`), vm(`"name":"a"`, `[]`), true, ""},
		"vm update, stamp added by an admin":     {VirtualMachine, "UPDATE", vm(stamp("10.0.0.5"), `["10.0.0.5"]`), vm(`"name":"a"`, `[]`), false, "admin"},
		"vm update, token forged, no address":    {VirtualMachine, "UPDATE", vm(`"annotations":{"vmipam.io/token":"t"}`, `[]`), vm(`"name":"a"`, `[]`), true, ""},
		"vm create, later webhook drops token":   {VirtualMachine, "CREATE", vm(`"name":"a"`, `["10.0.0.6"]`), "", true, ""},
		"vm create, stamp without token":         {VirtualMachine, "CREATE", vm(`"annotations":{"vmipam.io/address":"10.0.0.6"}`, `["10.0.0.6"]`), "", true, ""},
		"vm create, no address, no stamp":        {VirtualMachine, "CREATE", vm(`"name":"a"`, `[]`), "", false, ""},
		"vm update, added, stamp mismatched":     {VirtualMachine, "UPDATE", vm(stamp("10.0.0.5"), `["10.0.0.6"]`), vm(`"name":"a"`, `[]`), true, vmipamSA},
		"kubevirt create, stamped":               {kubevirtLike, "CREATE", kv(stamp("10.0.0.5"), `"[\"10.0.0.5\"]"`), "", false, ""},
		"kubevirt create, respelled":             {kubevirtLike, "CREATE", kv(stamp("10.0.0.5"), `"[ \"10.0.0.5\" ]"`), "", true, ""},
		"kubevirt create, changed":               {kubevirtLike, "CREATE", kv(stamp("10.0.0.5"), `"[\"10.0.0.6\"]"`), "", true, ""},
		"kubevirt update, annotation changed":    {kubevirtLike, "UPDATE", kv(stamp("10.0.0.5"), `"[\"10.0.0.6\"]"`), kv(stamp("10.0.0.5"), `"[\"10.0.0.5\"]"`), true, ""},
		"kubevirt update, template left alone":   {kubevirtLike, "UPDATE", kv(stamp("10.0.0.5")+`,"labels":{"a":"b"}`, `"[\"10.0.0.5\"]"`), kv(stamp("10.0.0.5"), `"[\"10.0.0.5\"]"`), false, ""},
		"kubevirt update, template dropped":      {kubevirtLike, "UPDATE", `{"metadata":{` + stamp("10.0.0.5") + `},"spec":{}}`, kv(stamp("10.0.0.5"), `"[\"10.0.0.5\"]"`), true, ""},
		"neon create, stamped, no status":        {neonLike, "CREATE", `{"metadata":{` + stamp("10.0.0.5") + `},"spec":{"extraNetwork":{"enable":true}}}`, "", false, ""},
		"neon create, stamp removed":             {neonLike, "CREATE", `{"metadata":{"annotations":{"vmipam.io/token":"t"}},"spec":{"extraNetwork":{"enable":true}}}`, "", true, ""},
		"neon status filled by vmipam":           {neonLike, "UPDATE", neon(stamp("10.0.0.5"), "10.0.0.5"), `{"metadata":{` + stamp("10.0.0.5") + `}}`, false, vmipamSA},
		"neon status filled before any stamp":    {neonLike, "UPDATE", neon(`"name":"a"`, "10.0.9.9"), neon(`"name":"a"`, ""), true, ""},
		"neon create with a status address":      {neonLike, "CREATE", neon(stamp("10.0.0.5"), "10.0.9.9"), "", true, ""},
		"neon status filled by its own IPAM":     {neonLike, "UPDATE", neon(stamp("10.0.0.5"), "10.0.9.9"), `{"metadata":{` + stamp("10.0.0.5") + `}}`, true, ""},
		"neon status changed after the fill":     {neonLike, "UPDATE", neon(stamp("10.0.0.5"), "10.0.0.6"), neon(stamp("10.0.0.5"), "10.0.0.5"), true, ""},
		"neon status cleared":                    {neonLike, "UPDATE", neon(stamp("10.0.0.5"), ""), neon(stamp("10.0.0.5"), "10.0.0.5"), true, ""},
		"neon out of scope, its own IPAM writes": {neonLike, "UPDATE", `{"metadata":{"name":"a"},"status":{"extraNetIP":"10.0.9.9"}}`, `{"metadata":{"name":"a"}}`, false, ""},
		"holder label removed by a user":         {VirtualMachine, "UPDATE", vm(stamp("10.0.0.5"), `["10.0.0.5"]`), `{"metadata":{` + stamp("10.0.0.5") + `,"labels":{"vmipam.io/holder":"h1"}},"spec":{"addresses":["10.0.0.5"]}}`, true, ""},
		"holder label moved by vmipam":           {VirtualMachine, "UPDATE", `{"metadata":{` + stamp("10.0.0.5") + `,"labels":{"vmipam.io/holder":"h2"}},"spec":{"addresses":["10.0.0.5"]}}`, `{"metadata":{` + stamp("10.0.0.5") + `,"labels":{"vmipam.io/holder":"h1"}},"spec":{"addresses":["10.0.0.5"]}}`, false, vmipamSA},
		"neon create out of scope, no stamp":     {neonLike, "CREATE", `{"metadata":{"name":"a"}}`, "", false, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			user := tc.user
			if user == "" {
				user = "alice"
			}
			failed := admit(t, tc.kind, tc.op, tc.obj, tc.old, user)
			if tc.denied != (len(failed) > 0) {
				t.Errorf("denied: %v (%q), want denied %v", len(failed) > 0, failed, tc.denied)
			}
		})
	}
}
