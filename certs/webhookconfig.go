package certs

import (
	"bytes"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	kindMutating   = "MutatingWebhookConfiguration"
	kindValidating = "ValidatingWebhookConfiguration"
)

// webhookConfig is one named MutatingWebhookConfiguration or
// ValidatingWebhookConfiguration.
type webhookConfig struct {
	kind string
	name string
	// obj is the configuration as last read or written; nil if it does
	// not exist.
	obj client.Object
}

func (w *webhookConfig) newObject() client.Object {
	if w.kind == kindMutating {
		return &admissionregistrationv1.MutatingWebhookConfiguration{}
	}
	return &admissionregistrationv1.ValidatingWebhookConfiguration{}
}

// bundlesOf returns the caBundle of each webhook of a configuration.
func bundlesOf(obj client.Object) [][]byte {
	var out [][]byte
	switch o := obj.(type) {
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		for _, h := range o.Webhooks {
			out = append(out, h.ClientConfig.CABundle)
		}
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		for _, h := range o.Webhooks {
			out = append(out, h.ClientConfig.CABundle)
		}
	}
	return out
}

// setBundle sets the caBundle of every webhook of a configuration and
// reports whether any changed.
func setBundle(obj client.Object, bundle []byte) bool {
	changed := false
	set := func(cc *admissionregistrationv1.WebhookClientConfig) {
		if !bytes.Equal(cc.CABundle, bundle) {
			cc.CABundle = bytes.Clone(bundle)
			changed = true
		}
	}
	switch o := obj.(type) {
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		for i := range o.Webhooks {
			set(&o.Webhooks[i].ClientConfig)
		}
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		for i := range o.Webhooks {
			set(&o.Webhooks[i].ClientConfig)
		}
	}
	return changed
}
