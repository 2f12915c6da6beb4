package kinds

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// ConfigKind and ConfigAPIVersion identify a kinds configuration file.
const (
	ConfigKind       = "KindsConfiguration"
	ConfigAPIVersion = "vmipam.io/v1alpha1"
)

// maxKinds bounds the kinds of one configuration.
const maxKinds = 32

// Config is the kinds configuration: the file given by vmipam's
// --kinds-config flag, from which `vmipam manifests` renders the webhook,
// the admission policies and the RBAC of every kind.
type Config struct {
	APIVersion string       `json:"apiVersion"`
	Kind       string       `json:"kind"`
	Kinds      []KindConfig `json:"kinds"`
}

// KindConfig is one kind vmipam serves.
type KindConfig struct {
	Group    string `json:"group"`
	Version  string `json:"version"`
	Kind     string `json:"kind"`
	Resource string `json:"resource"`
	// Scope is Namespaced (the default) or Cluster.
	Scope string `json:"scope,omitempty"`
	// Condition selects the objects given an address: a CEL expression
	// over `object` (standard CEL and the strings extension).
	Condition string        `json:"condition,omitempty"`
	Pool      PoolConfig    `json:"pool,omitempty"`
	Address   AddressConfig `json:"address"`
	// Network, if set, says where vmipam writes the network identity of
	// the address (its prefix length, the gateway and the routes of its
	// range) for the guest to read.
	Network *NetworkConfig `json:"network,omitempty"`
	// Families, if set, says where an object asks for an address of each
	// family (dual-stack), as a Service does.
	Families *FamiliesConfig `json:"families,omitempty"`
}

// FamiliesConfig names the fields of an object's family policy (a string:
// SingleStack, PreferDualStack or RequireDualStack) and, optionally, of
// its families in order (a list of IPv4 and IPv6), dotted paths under
// spec.
type FamiliesConfig struct {
	PolicyField string `json:"policyField"`
	Field       string `json:"field,omitempty"`
}

// NetworkConfig says where the network identity goes: an object field
// (a dotted path under spec, given an object with addresses, gateways and
// routes, as vmipam's own VirtualMachine's spec.network), or an
// annotation given the same object as JSON.
type NetworkConfig struct {
	Field      string            `json:"field,omitempty"`
	Annotation *AnnotationConfig `json:"annotation,omitempty"`
}

// PoolConfig says where an object names its pool: a string field, or an
// annotation of its metadata. With neither, the namespace's default pool
// applies.
type PoolConfig struct {
	Field      string `json:"field,omitempty"`
	Annotation string `json:"annotation,omitempty"`
}

// AddressConfig says where the address goes: exactly one of a field, an
// annotation or status fields.
type AddressConfig struct {
	// Field is a dotted path such as spec.addresses; Type is list (a list
	// of strings, the default) or string.
	Field string `json:"field,omitempty"`
	Type  string `json:"type,omitempty"`
	// Annotation is an annotation, of the object or of an object inside
	// it such as spec.template.metadata.
	Annotation *AnnotationConfig `json:"annotation,omitempty"`
	// Status is status fields filled after the create.
	Status *StatusConfig `json:"status,omitempty"`
}

// AnnotationConfig is an address annotation.
type AnnotationConfig struct {
	// Path is the object whose annotations hold it; metadata by default.
	Path string `json:"path,omitempty"`
	Key  string `json:"key"`
	// Format is plain (the default), comma or json.
	Format string `json:"format,omitempty"`
}

// StatusConfig is status fields filled after the create.
type StatusConfig struct {
	Address string `json:"address"`
	Mask    string `json:"mask,omitempty"`
	// MaskFormat is dotted (the default) or prefix.
	MaskFormat string `json:"maskFormat,omitempty"`
	// RequestAnnotation is where a user asks for a specific address;
	// vmipam.io/requested-address by default.
	RequestAnnotation string `json:"requestAnnotation,omitempty"`
}

// DefaultRequestAnnotation is where a user of a kind whose address goes
// into status asks for a specific address, unless configured otherwise.
const DefaultRequestAnnotation = "vmipam.io/requested-address"

// Default is the configuration without a file: vmipam's own kind.
func Default() []Kind { return []Kind{VirtualMachine} }

// OrDefault returns ts, or Default when ts is empty.
func OrDefault(ts []Kind) []Kind {
	if len(ts) == 0 {
		return Default()
	}
	return ts
}

// LoadOrDefault is Load, or Default when path is empty (no
// --kinds-config).
func LoadOrDefault(path string) ([]Kind, error) {
	if path == "" {
		return Default(), nil
	}
	return Load(path)
}

// Load reads and checks the kinds configuration file at path.
func Load(path string) ([]Kind, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the kinds configuration: %w", err)
	}
	ts, err := Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("kinds configuration %s: %w", path, err)
	}
	return ts, nil
}

// Parse checks a kinds configuration and returns its Kinds. Every
// problem is reported, naming its field and the fix.
func Parse(raw []byte) ([]Kind, error) {
	var c Config
	if err := yaml.UnmarshalStrict(raw, &c); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	var errs field.ErrorList
	if c.APIVersion != ConfigAPIVersion || c.Kind != ConfigKind {
		errs = append(errs, field.Invalid(field.NewPath("kind"), c.APIVersion+" "+c.Kind,
			fmt.Sprintf("must be apiVersion: %s, kind: %s", ConfigAPIVersion, ConfigKind)))
	}
	root := field.NewPath("kinds")
	switch {
	case len(c.Kinds) == 0:
		errs = append(errs, field.Required(root, "list at least one kind, for example vmipam's own VirtualMachine"))
	case len(c.Kinds) > maxKinds:
		errs = append(errs, field.TooMany(root, len(c.Kinds), maxKinds))
	}
	var out []Kind
	seen := map[schema.GroupResource]int{}
	paths := map[string]int{}
	for i, k := range c.Kinds {
		p := root.Index(i)
		t, kerrs := k.kind(p)
		errs = append(errs, kerrs...)
		if j, dup := seen[t.GVR().GroupResource()]; dup && len(kerrs) == 0 {
			errs = append(errs, field.Duplicate(p.Child("resource"), fmt.Sprintf("%s.%s, already kinds[%d]", k.Resource, k.Group, j)))
		} else if j, dup := paths[t.PathName()]; dup && len(kerrs) == 0 {
			errs = append(errs, field.Duplicate(p.Child("group"), fmt.Sprintf("%s: its webhook path would be kinds[%d]'s (/mutate-%s)", k.Group, j, t.PathName())))
		}
		seen[t.GVR().GroupResource()] = i
		paths[t.PathName()] = i
		out = append(out, t)
	}
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return out, nil
}

// PathName names the kind in a URL path: its group with dashes for dots,
// its version and its kind in lower case (vmipam-io-v1alpha1-virtualmachine).
func (t Kind) PathName() string {
	g := strings.ReplaceAll(t.GVK.Group, ".", "-")
	if g == "" {
		g = "core"
	}
	return g + "-" + t.GVK.Version + "-" + strings.ToLower(t.GVK.Kind)
}

// celReserved are CEL's reserved words, which cannot name a field in an
// expression.
var celReserved = map[string]bool{
	"as": true, "break": true, "const": true, "continue": true, "else": true, "false": true, "for": true, "function": true,
	"if": true, "import": true, "in": true, "let": true, "loop": true, "package": true, "namespace": true, "null": true,
	"return": true, "true": true, "var": true, "void": true, "while": true,
}

// segment is one element of a dotted path: a CEL identifier, so that the
// rendered policies can name it.
var segment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// splitPath checks a dotted path and splits it; under, if set, is the
// element it must start with.
func splitPath(p *field.Path, s string, under ...string) ([]string, *field.Error) {
	parts := strings.Split(s, ".")
	for _, e := range parts {
		if !segment.MatchString(e) {
			return nil, field.Invalid(p, s, "must be a dotted path of field names such as spec.network.address (letters, digits and _)")
		}
		if celReserved[e] {
			return nil, field.Invalid(p, s, fmt.Sprintf("%q is a reserved word of CEL, in which vmipam's admission policy names the field; vmipam cannot serve a field by that name", e))
		}
	}
	if len(parts) < 2 {
		return nil, field.Invalid(p, s, "must name a field inside the object, such as spec.address")
	}
	if len(under) > 0 && !slices.Contains(under, parts[0]) {
		return nil, field.Invalid(p, s, "must start with "+strings.Join(under, " or "))
	}
	return parts, nil
}

func annotationKey(p *field.Path, k string) *field.Error {
	if k == "" {
		return field.Required(p, "name the annotation, for example example.com/ip")
	}
	if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
		return field.Invalid(p, k, strings.Join(msgs, "; "))
	}
	if slices.Contains([]string{vmipamv1.TokenAnnotation, vmipamv1.PoolAnnotation, vmipamv1.AddressAnnotation}, k) {
		return field.Invalid(p, k, "is vmipam's own record; choose another annotation")
	}
	return nil
}

func (k KindConfig) kind(p *field.Path) (Kind, field.ErrorList) {
	var errs field.ErrorList
	add := func(e *field.Error) {
		if e != nil {
			errs = append(errs, e)
		}
	}
	t := Kind{GVK: schema.GroupVersionKind{Group: k.Group, Version: k.Version, Kind: k.Kind}, Resource: k.Resource, Condition: k.Condition}
	if k.Group != "" {
		for _, m := range validation.IsDNS1123Subdomain(k.Group) {
			add(field.Invalid(p.Child("group"), k.Group, m))
		}
	}
	if k.Version == "" {
		add(field.Required(p.Child("version"), "the served version, for example v1"))
	}
	if k.Kind == "" || !segment.MatchString(k.Kind) {
		add(field.Invalid(p.Child("kind"), k.Kind, "the kind, for example VirtualMachine"))
	}
	if msgs := validation.IsDNS1035Label(k.Resource); len(msgs) > 0 {
		add(field.Invalid(p.Child("resource"), k.Resource, "the plural resource, for example virtualmachines"))
	}
	switch k.Scope {
	case "", "Namespaced":
	case "Cluster":
		t.ClusterScoped = true
	default:
		add(field.NotSupported(p.Child("scope"), k.Scope, []string{"Namespaced", "Cluster"}))
	}
	if k.Condition != "" {
		if _, err := compileCondition(k.Condition); err != nil {
			add(field.Invalid(p.Child("condition"), k.Condition, err.Error()))
		}
	}
	pp := p.Child("pool")
	switch {
	case k.Pool.Field != "" && k.Pool.Annotation != "":
		add(field.Invalid(pp, k.Pool, "give a field or an annotation, not both"))
	case k.Pool.Field != "":
		f, e := splitPath(pp.Child("field"), k.Pool.Field, "spec")
		add(e)
		t.PoolField = f
	case k.Pool.Annotation != "":
		add(annotationKey(pp.Child("annotation"), k.Pool.Annotation))
		t.PoolAnnotation = k.Pool.Annotation
	}
	if k.Network != nil {
		k.network(p.Child("network"), &t, add)
	}
	ap := p.Child("address")
	a := k.Address
	n := 0
	for _, set := range []bool{a.Field != "", a.Annotation != nil, a.Status != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		add(field.Invalid(ap, "", "give exactly one of field, annotation and status"))
		return t, errs
	}
	switch {
	case a.Field != "":
		f, e := splitPath(ap.Child("field"), a.Field, "spec")
		add(e)
		switch a.Type {
		case "", "list":
			t.AddressesField = f
		case "string":
			t.AddressField = f
		default:
			add(field.NotSupported(ap.Child("type"), a.Type, []string{"list", "string"}))
		}
	case a.Annotation != nil:
		an := ap.Child("annotation")
		add(annotationKey(an.Child("key"), a.Annotation.Key))
		t.AddressAnnotation = a.Annotation.Key
		t.AnnotationPath = annotationPath(an.Child("path"), a.Annotation.Path, add)
		switch Format(a.Annotation.Format) {
		case "", FormatPlain:
			t.AnnotationFormat = FormatPlain
		case FormatComma, FormatJSON:
			t.AnnotationFormat = Format(a.Annotation.Format)
		default:
			add(field.NotSupported(an.Child("format"), a.Annotation.Format, []string{string(FormatPlain), string(FormatComma), string(FormatJSON)}))
		}
	default:
		sp := ap.Child("status")
		s := &StatusFields{RequestAnnotation: a.Status.RequestAnnotation, MaskFormat: MaskFormat(a.Status.MaskFormat)}
		f, e := splitPath(sp.Child("address"), a.Status.Address, "status")
		add(e)
		s.Address = f
		if a.Status.Mask != "" {
			m, e := splitPath(sp.Child("mask"), a.Status.Mask, "status")
			add(e)
			s.Mask = m
		}
		switch s.MaskFormat {
		case "":
			s.MaskFormat = MaskDotted
		case MaskDotted, MaskPrefix:
		default:
			add(field.NotSupported(sp.Child("maskFormat"), a.Status.MaskFormat, []string{string(MaskDotted), string(MaskPrefix)}))
		}
		if s.RequestAnnotation == "" {
			s.RequestAnnotation = DefaultRequestAnnotation
		}
		add(annotationKey(sp.Child("requestAnnotation"), s.RequestAnnotation))
		t.Status = s
	}
	if k.Families != nil {
		k.families(p.Child("families"), &t, add)
	}
	return t, errs
}

// annotationPath checks the path of the object whose annotations hold an
// annotation: empty or metadata for the object's own, or a dotted path
// under spec ending in metadata.
func annotationPath(p *field.Path, path string, add func(*field.Error)) []string {
	if path == "" || path == "metadata" {
		return nil
	}
	f, e := splitPath(p, path, "spec")
	add(e)
	if e == nil && f[len(f)-1] != "metadata" {
		add(field.Invalid(p, path, "must name an object's metadata, such as spec.template.metadata"))
	}
	return f
}

// network reads the network location into t.
func (k KindConfig) network(np *field.Path, t *Kind, add func(*field.Error)) {
	n := k.Network
	switch {
	case (n.Field != "") == (n.Annotation != nil):
		add(field.Invalid(np, "", "give a field or an annotation, exactly one"))
	case n.Field != "":
		f, e := splitPath(np.Child("field"), n.Field, "spec")
		add(e)
		t.NetworkField = f
		if a := k.Address.Field; e == nil && a != "" && (strings.HasPrefix(a+".", n.Field+".") || strings.HasPrefix(n.Field+".", a+".")) {
			add(field.Invalid(np.Child("field"), n.Field, "must not hold, or lie inside, address.field "+a))
		}
	default:
		an := np.Child("annotation")
		add(annotationKey(an.Child("key"), n.Annotation.Key))
		if k.Address.Annotation != nil && k.Address.Annotation.Key == n.Annotation.Key && k.Address.Annotation.Path == n.Annotation.Path {
			add(field.Invalid(an.Child("key"), n.Annotation.Key, "is the address's annotation; choose another"))
		}
		if n.Annotation.Format != "" && n.Annotation.Format != string(FormatJSON) {
			add(field.NotSupported(an.Child("format"), n.Annotation.Format, []string{string(FormatJSON)}))
		}
		t.NetworkAnnotation = n.Annotation.Key
		t.NetworkAnnotationPath = annotationPath(an.Child("path"), n.Annotation.Path, add)
	}
}

// families reads the family fields into t, whose address location must
// hold two addresses.
func (k KindConfig) families(fp *field.Path, t *Kind, add func(*field.Error)) {
	f := k.Families
	if t.MaxAddresses() < 2 {
		add(field.Invalid(fp, "", "the address location holds one address: dual-stack needs a list field, or an annotation in comma or json format"))
	}
	if f.PolicyField == "" {
		add(field.Required(fp.Child("policyField"), "the field of the family policy, such as spec.ipFamilyPolicy"))
	} else {
		p, e := splitPath(fp.Child("policyField"), f.PolicyField, "spec")
		add(e)
		t.FamilyPolicyField = p
	}
	if f.Field != "" {
		p, e := splitPath(fp.Child("field"), f.Field, "spec")
		add(e)
		t.FamiliesField = p
	}
}

// celEnv is the environment of a kind's condition: the object, as the
// API server's match conditions see it.
var celEnv = func() *cel.Env {
	env, err := cel.NewEnv(cel.Variable("object", cel.DynType), ext.Strings())
	if err != nil {
		panic(err)
	}
	return env
}()

// programs caches the compiled conditions, by expression.
var programs sync.Map

// maxConditionCost bounds the evaluation of a condition, as the API server
// bounds a match condition's.
const maxConditionCost = 1_000_000

func compileCondition(expr string) (cel.Program, error) {
	ast, iss := celEnv.Compile(expr)
	if iss.Err() != nil {
		return nil, fmt.Errorf("not a CEL expression over object: %w", iss.Err())
	}
	if ast.OutputType() != cel.BoolType && ast.OutputType() != cel.DynType {
		return nil, fmt.Errorf("must be true or false, not a %s", ast.OutputType())
	}
	prg, err := celEnv.Program(ast, cel.CostLimit(maxConditionCost))
	if err != nil {
		return nil, fmt.Errorf("compile: %w", err)
	}
	return prg, nil
}

// InScope reports whether obj is one the kind gives an address to: its
// condition holds, or it has none. A condition that fails to evaluate
// (a field it reads is missing) does not hold, as it would not match in
// the API server's webhook either.
func (t Kind) InScope(obj *unstructured.Unstructured) bool {
	if t.Condition == "" {
		return true
	}
	var prg cel.Program
	if p, ok := programs.Load(t.Condition); ok {
		prg = p.(cel.Program)
	} else {
		p, err := compileCondition(t.Condition)
		if err != nil {
			return false
		}
		programs.Store(t.Condition, p)
		prg = p
	}
	out, _, err := prg.Eval(map[string]any{"object": obj.Object})
	if err != nil {
		return false
	}
	b, ok := out.Value().(bool)
	return ok && b
}
