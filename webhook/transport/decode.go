package transport

import (
	"bytes"
	"errors"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/vmipam/vmipam/lib/jsonscan"
)

// The review's fields, by their index in reviewPaths: only those a
// handler reads. (The requesting user, requestKind and requestResource are
// left out: no handler reads them.)
const (
	rvAPIVersion = iota
	rvKind
	rvUID
	rvKindGroup
	rvKindVersion
	rvKindKind
	rvResourceGroup
	rvResourceVersion
	rvResourceResource
	rvSubResource
	rvName
	rvNamespace
	rvOperation
	rvObject
	rvOldObject
	rvDryRun
)

var reviewPaths = [][]string{
	rvAPIVersion: {"apiVersion"}, rvKind: {"kind"}, rvUID: {"request", "uid"},
	rvKindGroup: {"request", "kind", "group"}, rvKindVersion: {"request", "kind", "version"}, rvKindKind: {"request", "kind", "kind"},
	rvResourceGroup: {"request", "resource", "group"}, rvResourceVersion: {"request", "resource", "version"},
	rvResourceResource: {"request", "resource", "resource"},
	rvSubResource:      {"request", "subResource"},
	rvName:             {"request", "name"}, rvNamespace: {"request", "namespace"}, rvOperation: {"request", "operation"},
	rvObject: {"request", "object"}, rvOldObject: {"request", "oldObject"},
	rvDryRun: {"request", "dryRun"},
}

// decodeReview reads an AdmissionReview v1 request in one pass over the
// body, decoding only the strings and the flag the handlers read, with no
// reflection: the objects it carries stay
// slices of the body (the handlers read them with kinds.Kind.Read), so
// a request costs its body's bytes and a scan, however large its object.
// The body is not validated as a whole: the API server sends valid JSON,
// and a forged body gains nothing from a parse that differs (every field a
// handler uses is decoded strictly).
func decodeReview(body []byte) (admission.Request, error) {
	if jsonscan.KindOf(body) != jsonscan.KindObject {
		return admission.Request{}, errors.New("the request body is not a JSON object")
	}
	v := jsonscan.Extract(body, reviewPaths...)
	var errs []error
	str := func(i int, name string) string {
		if v[i] == nil {
			return ""
		}
		s, err := jsonscan.String(v[i])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		return s
	}
	apiVersion, kind := str(rvAPIVersion, "apiVersion"), str(rvKind, "kind")
	if apiVersion != admissionv1.SchemeGroupVersion.String() || kind != "AdmissionReview" {
		return admission.Request{}, fmt.Errorf("the request body is a %q %q; vmipam serves admission.k8s.io/v1 AdmissionReview only (admissionReviewVersions: [v1])",
			apiVersion, kind)
	}
	var q admissionv1.AdmissionRequest
	q.UID = types.UID(str(rvUID, "request.uid"))
	q.Kind = metav1.GroupVersionKind{
		Group: str(rvKindGroup, "request.kind.group"), Version: str(rvKindVersion, "request.kind.version"), Kind: str(rvKindKind, "request.kind.kind"),
	}
	q.Resource = metav1.GroupVersionResource{
		Group: str(rvResourceGroup, "request.resource.group"), Version: str(rvResourceVersion, "request.resource.version"),
		Resource: str(rvResourceResource, "request.resource.resource"),
	}
	q.SubResource = str(rvSubResource, "request.subResource")
	q.Name, q.Namespace = str(rvName, "request.name"), str(rvNamespace, "request.namespace")
	q.Operation = admissionv1.Operation(str(rvOperation, "request.operation"))
	switch d := v[rvDryRun]; {
	case d == nil || jsonscan.KindOf(d) == jsonscan.KindNull:
	case jsonscan.KindOf(d) != jsonscan.KindBool:
		errs = append(errs, fmt.Errorf("request.dryRun: must be true or false, not %s", jsonscan.KindOf(d)))
	default:
		dry := bytes.TrimSpace(d)[0] == 't'
		q.DryRun = &dry
	}
	for i, into := range map[int]*runtime.RawExtension{rvObject: &q.Object, rvOldObject: &q.OldObject} {
		if raw := v[i]; raw != nil && jsonscan.KindOf(raw) != jsonscan.KindNull {
			// A slice of the body, not a copy: the body outlives the
			// request's handling.
			into.Raw = raw
		}
	}
	if len(errs) > 0 {
		return admission.Request{}, fmt.Errorf("the request body is not a valid AdmissionReview: %w", errors.Join(errs...))
	}
	if q.UID == "" {
		return admission.Request{}, errors.New("the AdmissionReview holds no request with a uid")
	}
	return admission.Request{AdmissionRequest: q}, nil
}
