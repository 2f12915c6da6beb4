package kinds

import (
	"regexp"
	"slices"
	"strings"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// Rule is one check of a kind's admission policies: a CEL expression over
// object, oldObject and request that must hold on the operations it names,
// and the message when it does not.
type Rule struct {
	Expression string
	Message    string
	// Reason is the status reason of a denial: Invalid or Forbidden.
	Reason string
	// Operations are the operations the rule checks: OpCreate, OpUpdate or
	// both. Each operation gets a policy of its own (see
	// manifests.Policies), so that a create evaluates only its own rule.
	Operations []string
}

// The operations a Rule checks, as admission names them.
const (
	OpCreate = "CREATE"
	OpUpdate = "UPDATE"
)

// On reports whether r checks operation op.
func (r Rule) On(op string) bool { return slices.Contains(r.Operations, op) }

// celHas returns the CEL test that path exists under root, element by
// element: has(object.spec) && has(object.spec.addresses).
func celHas(root string, path []string) string {
	var parts []string
	for i := range path {
		parts = append(parts, "has("+root+"."+strings.Join(path[:i+1], ".")+")")
	}
	return strings.Join(parts, " && ")
}

// celAnnotation returns the value of annotation key in the annotations of
// the object at meta under root, or ”.
func celAnnotation(root string, meta []string, key string) string {
	m := root + "." + strings.Join(meta, ".") + ".annotations"
	q := celQuote(key)
	return "(" + celHas(root, append(meta[:len(meta):len(meta)], "annotations")) + " && " + q + " in " + m + " ? " + m + "[" + q + "] : '')"
}

// celQuote quotes s as a CEL string. Annotation keys and addresses hold
// no quote or backslash (they are qualified names and IP addresses).
func celQuote(s string) string { return "'" + s + "'" }

// celValue returns the address location's value under root: a list of
// strings for a list field ([] when absent), a string otherwise (”).
func (t Kind) celValue(root string) (expr, empty string) {
	loc, kind := t.location()
	switch kind {
	case locList:
		return "(" + celHas(root, loc) + " ? " + root + "." + strings.Join(loc, ".") + " : [])", "[]"
	case locString:
		return "(" + celHas(root, loc) + " ? " + root + "." + strings.Join(loc, ".") + " : '')", "''"
	}
	return celAnnotation(root, loc[:len(loc)-2], loc[len(loc)-1]), "''"
}

// celRender returns how the address location holds the addresses of the
// CEL string s, vmipam's address annotation (comma-separated), as vmipam
// stamps them.
func (t Kind) celRender(s string) string {
	_, kind := t.location()
	switch {
	case kind == locList:
		return s + ".split(',')"
	case kind == locAnnotation && t.format() == FormatJSON:
		return `'["' + ` + s + `.replace(',', '","') + '"]'`
	}
	return s
}

func stampOf(root, key string) string { return celAnnotation(root, []string{"metadata"}, key) }

// Variable is a named CEL expression of a policy, which its rules read as
// variables.<name>.
type Variable struct{ Name, Expression string }

// Writers are who may write vmipam's stamp on an existing object: vmipam's
// service account, and the cluster's administrators (who could remove the
// policy anyway; the tests and local runs run vmipam as one).
type Writers struct {
	Users, Groups []string
}

// celList writes ss as a CEL list of strings.
func celList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = celQuote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// PolicyRules returns the checks that keep what vmipam stamped on the
// kind's objects as vmipam stamped it, for the API server to run as
// ValidatingAdmissionPolicies on CREATE and UPDATE (of the object and, for
// a kind whose address goes into status, of its status), so that no VM
// update calls vmipam, and the variables they read:
//   - on CREATE of an object in scope (its kind's condition holds; not a
//     dry run), an address is there only with vmipam's token and stamp
//     beside it, and is the stamped one: no later mutating webhook changed
//     it, removed the stamp, or put an address of its own;
//   - the address is immutable once assigned, and appears on an existing
//     object only with a new stamp written by one of w (vmipam's
//     controller, assigning one to an object that bypassed the webhook);
//   - vmipam's token, pool and address annotations are immutable once
//     set, and only w may set them on an existing object;
//   - a status address of an object in scope is the one vmipam recorded,
//     and immutable once set;
//   - only w move vmipam's holder label.
func (t Kind) PolicyRules(w Writers) ([]Variable, []Rule) {
	where := t.AddressesPath()
	vars := []Variable{
		{"token", stampOf("object", vmipamv1.TokenAnnotation)},
		{"oldToken", stampOf("oldObject", vmipamv1.TokenAnnotation)},
		{"pool", stampOf("object", vmipamv1.PoolAnnotation)},
		{"oldPool", stampOf("oldObject", vmipamv1.PoolAnnotation)},
		{"stamp", stampOf("object", vmipamv1.AddressAnnotation)},
		{"oldStamp", stampOf("oldObject", vmipamv1.AddressAnnotation)},
		{"writer", "request.userInfo.username in " + celList(w.Users) +
			" || has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in " + celList(w.Groups) + ")"},
		{"inScope", "true"},
		{"holder", holderOf("object")},
		{"oldHolder", holderOf("oldObject")},
		{"dryRun", "has(request.dryRun) && request.dryRun"},
	}
	if t.Condition != "" {
		vars[7].Expression = "(" + t.Condition + ")"
	}
	// Who looks after an object: a label only vmipam moves, so that no
	// user can take an object out of its replica's watch.
	onCreate, onUpdate := []string{OpCreate}, []string{OpUpdate}
	holderRule := Rule{
		Expression: "variables.holder == variables.oldHolder || variables.writer",
		Message:    "metadata.labels[" + vmipamv1.HolderLabel + "] is written by vmipam only: it names the replica that looks after the object's address",
		Reason:     "Forbidden", Operations: onUpdate,
	}
	create := func(e string) string { return "variables.dryRun || !variables.inScope || " + e }
	var rules []Rule
	if t.Status == nil {
		cur, empty := t.celValue("object")
		old, _ := t.celValue("oldObject")
		vars = append(vars, Variable{"address", cur}, Variable{"oldAddress", old})
		stamped := t.celRender("variables.stamp")
		rules = append(rules,
			Rule{
				Expression: create("variables.address == " + empty + " && variables.stamp == '' || variables.token != '' && variables.stamp != '' && variables.address == " + stamped),
				Message: where + " must be the address vmipam reserved for this object (metadata.annotations[" + vmipamv1.AddressAnnotation +
					"], beside its token): another mutating webhook changed it or removed vmipam's stamp; vmipam's address cannot be overridden",
				Reason: "Invalid", Operations: onCreate,
			},
			Rule{
				Expression: "variables.oldAddress == " + empty + " || variables.address == variables.oldAddress",
				Message:    where + " is immutable once assigned; delete and recreate the object to get another address",
				Reason:     "Forbidden", Operations: onUpdate,
			},
			Rule{
				Expression: "variables.oldAddress != " + empty + " || variables.address == " + empty +
					" || variables.writer && variables.stamp != '' && variables.stamp != variables.oldStamp && variables.address == " + stamped,
				Message: where + ": addresses are assigned by vmipam when the object is created; to ask for a specific one, delete and recreate the object with it",
				Reason:  "Forbidden", Operations: onUpdate,
			})
	} else {
		sp := strings.Join(t.Status.Address, ".")
		vars = append(vars,
			Variable{"statusAddress", "(" + celHas("object", t.Status.Address) + " ? object." + sp + " : '')"},
			Variable{"oldStatusAddress", "(" + celHas("oldObject", t.Status.Address) + " ? oldObject." + sp + " : '')"})
		rules = append(rules,
			Rule{
				Expression: create("variables.token != '' && variables.stamp != '' && (variables.statusAddress == '' || variables.statusAddress == variables.stamp)"),
				Message:    "metadata.annotations[" + vmipamv1.AddressAnnotation + "]: another mutating webhook removed the address vmipam reserved for this object, or " + sp + " differs from it",
				Reason:     "Invalid", Operations: onCreate,
			},
			Rule{
				Expression: "variables.oldStatusAddress == '' || variables.statusAddress == variables.oldStatusAddress",
				Message:    sp + " is immutable once set; delete and recreate the object to get another address",
				Reason:     "Forbidden", Operations: onUpdate,
			},
			Rule{
				Expression: "!variables.inScope || variables.statusAddress == '' || variables.stamp != '' && variables.statusAddress == variables.stamp",
				Message: sp + " must be the address vmipam assigned (metadata.annotations[" + vmipamv1.AddressAnnotation +
					"]): vmipam fills it; leave it alone",
				Reason: "Forbidden", Operations: []string{OpCreate, OpUpdate},
			})
	}
	for _, f := range []struct{ key, now, was string }{
		{vmipamv1.TokenAnnotation, "token", "oldToken"},
		{vmipamv1.PoolAnnotation, "pool", "oldPool"},
		{vmipamv1.AddressAnnotation, "stamp", "oldStamp"},
	} {
		rules = append(rules, Rule{
			Expression: "variables." + f.now + " == variables." + f.was + " || variables." + f.was + " == '' && variables.writer",
			Message:    "metadata.annotations[" + f.key + "] is written by vmipam only, and immutable once set",
			Reason:     "Forbidden", Operations: onUpdate,
		})
	}
	return vars, append(rules, holderRule)
}

// holderOf returns the holder label of the object under root, or ”.
func holderOf(root string) string {
	m := root + ".metadata.labels"
	q := celQuote(vmipamv1.HolderLabel)
	return "(has(" + root + ".metadata.labels) && " + q + " in " + m + " ? " + m + "[" + q + "] : '')"
}

// Policy returns the rules of PolicyRules that check operation op, and the
// variables they read: what the kind's policy for op holds.
func (t Kind) Policy(op string, w Writers) ([]Variable, []Rule) {
	vars, rules := t.PolicyRules(w)
	var keep []Rule
	for _, r := range rules {
		if r.On(op) {
			keep = append(keep, r)
		}
	}
	var used []Variable
	for _, v := range vars {
		ref := regexp.MustCompile(`\bvariables\.` + regexp.QuoteMeta(v.Name) + `\b`)
		if slices.ContainsFunc(keep, func(r Rule) bool { return ref.MatchString(r.Expression) }) {
			used = append(used, v)
		}
	}
	return used, keep
}
