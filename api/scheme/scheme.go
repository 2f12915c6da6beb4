// Package scheme holds the one runtime.Scheme of vmipam: the built-in
// kinds and vmipam's own (api/v1alpha1). The binary, its composition root
// and every test that builds a client use it, so that no second Scheme
// drifts from it.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// Scheme knows the built-in kinds and vmipam's.
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(Scheme))
	utilruntime.Must(vmipamv1.AddToScheme(Scheme))
}
