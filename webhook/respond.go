package webhook

import (
	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// deny turns a StatusError into a denial that keeps its code and details,
// so kubectl prints the field and the reason.
func deny(err *apierrors.StatusError) admission.Response {
	st := err.Status()
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &st}}
}
