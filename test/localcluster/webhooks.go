// Package localcluster installs vmipam's webhook configurations on a control
// plane where vmipam runs on the same machine, outside the cluster: the
// webhooks point at a URL instead of a Service. hack/localcluster (make run)
// and the binary's end-to-end test use it.
package localcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/kinds/manifests"
)

// InstallWebhooks installs the generated webhook configurations under the
// names vmipam's deployment uses, and the wiring of kinds (the mutating
// webhook, the admission policies and the RBAC `vmipam manifests` renders;
// vmipam's own kind when empty), pointing at a vmipam on this machine and
// excluding vmipam's namespace. vmipam injects its own CA into them.
func InstallWebhooks(ctx context.Context, c client.Client, file, url, namespace string, ks []kinds.Kind) error {
	for _, o := range manifests.All(kinds.OrDefault(ks), manifests.Options{URL: url, Namespace: namespace}) {
		obj, ok := o.(client.Object)
		if !ok {
			continue
		}
		if err := c.Create(ctx, obj); err != nil {
			return fmt.Errorf("create %s %s: %w", o.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
		}
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read webhook manifests: %w", err)
	}
	exclude := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{namespace},
	}}}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var probe metav1.TypeMeta
		var doc runtime.RawExtension
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("parse webhook manifests: %w", err)
		}
		if len(bytes.TrimSpace(doc.Raw)) == 0 {
			continue
		}
		if err := utilyaml.Unmarshal(doc.Raw, &probe); err != nil {
			return err
		}
		switch probe.Kind {
		case "ValidatingWebhookConfiguration":
			var v admissionregv1.ValidatingWebhookConfiguration
			if err := utilyaml.Unmarshal(doc.Raw, &v); err != nil {
				return err
			}
			v.Name = "vmipam-validating"
			for i := range v.Webhooks {
				v.Webhooks[i].ClientConfig = urlConfig(url, v.Webhooks[i].ClientConfig)
				v.Webhooks[i].NamespaceSelector = exclude
			}
			if err := c.Create(ctx, &v); err != nil {
				return fmt.Errorf("create %s: %w", v.Name, err)
			}
		}
	}
}

func urlConfig(base string, in admissionregv1.WebhookClientConfig) admissionregv1.WebhookClientConfig {
	path := ""
	if in.Service != nil && in.Service.Path != nil {
		path = *in.Service.Path
	}
	u := strings.TrimSuffix(base, "/") + path
	return admissionregv1.WebhookClientConfig{URL: &u}
}
