package pools

import (
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/vmipam/vmipam/kinds"
)

// MarkServed records that the API server serves kind gvk: from then on a
// listing that finds it not served fails rather than finds no object.
func (r *Registry) MarkServed(gvk schema.GroupVersionKind) {
	r.servedMu.Lock()
	defer r.servedMu.Unlock()
	if r.servedKinds == nil {
		r.servedKinds = map[schema.GroupVersionKind]bool{}
	}
	r.servedKinds[gvk] = true
}

func (r *Registry) served(gvk schema.GroupVersionKind) bool {
	r.servedMu.Lock()
	defer r.servedMu.Unlock()
	return r.servedKinds[gvk]
}

// KindOf returns the configured kind gvk, if it is one.
func (r *Registry) KindOf(gvk schema.GroupVersionKind) (kinds.Kind, bool) {
	for _, t := range r.opts.Kinds {
		if t.GVK == gvk {
			return t, true
		}
	}
	return kinds.Kind{}, false
}
