package integration

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/test/harness"
)

// installDenyWebhook registers, for the test's namespace only, a second
// validating webhook that denies every VirtualMachine: an admission step
// after vmipam's that discards the object vmipam already gave an address.
func installDenyWebhook(t *testing.T, ns, pool string) {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		review.Response = &admissionv1.AdmissionResponse{
			UID: review.Request.UID, Allowed: false,
			Result: &metav1.Status{Code: http.StatusForbidden, Message: errDenied.Error()},
		}
		review.Request = nil
		_ = json.NewEncoder(w).Encode(review)
	}))
	t.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	none := admissionregv1.SideEffectClassNone
	fail := admissionregv1.Fail
	cfg := &admissionregv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-" + ns},
		Webhooks: []admissionregv1.ValidatingWebhook{{
			Name:                    "deny.test.vmipam.io",
			ClientConfig:            admissionregv1.WebhookClientConfig{URL: ptr.To(srv.URL + "/"), CABundle: ca},
			Rules:                   []admissionregv1.RuleWithOperations{{Operations: []admissionregv1.OperationType{admissionregv1.Create}, Rule: admissionregv1.Rule{APIGroups: []string{"vmipam.io"}, APIVersions: []string{"v1alpha1"}, Resources: []string{"virtualmachines"}}}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
			SideEffects:             &none,
			FailurePolicy:           &fail,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	if err := k8sClient.Create(context.Background(), cfg); err != nil {
		t.Fatalf("install the denying webhook: %v", err)
	}
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), cfg) })
	// The API server loads webhook configurations asynchronously: wait
	// until a dry run (no side effect in vmipam) meets the denial.
	harness.Eventually(t, 30*time.Second, "the denying webhook to be active", func() error {
		err := k8sClient.Create(context.Background(), vm(ns, "probe", pool), client.DryRunAll)
		if err != nil && strings.Contains(err.Error(), errDenied.Error()) {
			return nil
		}
		return fmt.Errorf("dry run: %w", err)
	})
}
