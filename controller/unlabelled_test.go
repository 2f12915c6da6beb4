package controller

import (
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/kinds"
)

// TestUnchanged: an event of a settled unlabelled object is skipped only if
// nothing that could change what the controller found did change: not its
// spec (generation), the labels and annotations its kind may read, or
// vmipam's marks; its deletion alone (one generation more) is skipped, and
// remembered.
func TestUnchanged(t *testing.T) {
	meta := func(edit func(m *metav1.PartialObjectMetadata)) *metav1.PartialObjectMetadata {
		m := kinds.VirtualMachine.NewMetadata()
		m.ObjectMeta = metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "u", Generation: 3,
			Labels: map[string]string{"app": "x", "tier": "db"}, Annotations: map[string]string{"note": "n"}, Finalizers: []string{"other.io/keep"}}
		if edit != nil {
			edit(m)
		}
		return m
	}
	// A kind with a condition, which may read any label or annotation.
	conditional := kinds.VirtualMachine
	conditional.Condition = "has(object.metadata.labels)"
	now := metav1.Now()
	deleting := func(m *metav1.PartialObjectMetadata) { m.DeletionTimestamp = &now; m.Generation++ }
	tests := map[string]struct {
		edit func(m *metav1.PartialObjectMetadata)
		want bool
		// then, if set, is a second event after the first.
		then     func(m *metav1.PartialObjectMetadata)
		wantThen bool
		// noCondition takes a kind that reads no label and no annotation
		// but its own.
		noCondition bool
	}{
		"a label changed, read by no one":        {edit: func(m *metav1.PartialObjectMetadata) { m.Labels["app"] = "y" }, want: true, noCondition: true},
		"its pool annotation set":                {edit: func(m *metav1.PartialObjectMetadata) { m.Annotations[vmipamv1.PoolAnnotation] = "p" }, noCondition: true},
		"the last-applied configuration changed": {edit: func(m *metav1.PartialObjectMetadata) { m.Annotations[corev1.LastAppliedConfigAnnotation] = "{}" }, want: true},
		"the same":                               {want: true},
		"labels in another order":                {edit: func(m *metav1.PartialObjectMetadata) { m.Labels = map[string]string{"tier": "db", "app": "x"} }, want: true},
		"another object under the name":          {edit: func(m *metav1.PartialObjectMetadata) { m.UID = "v" }},
		"its spec changed":                       {edit: func(m *metav1.PartialObjectMetadata) { m.Generation++ }},
		"a label changed":                        {edit: func(m *metav1.PartialObjectMetadata) { m.Labels["app"] = "y" }},
		"a label moved to the annotations":       {edit: func(m *metav1.PartialObjectMetadata) { delete(m.Labels, "app"); m.Annotations["app"] = "x" }},
		"an annotation added":                    {edit: func(m *metav1.PartialObjectMetadata) { m.Annotations["pool"] = "p" }},
		"vmipam's finalizer added":               {edit: func(m *metav1.PartialObjectMetadata) { m.Finalizers = append(m.Finalizers, vmipamv1.Finalizer) }},
		"vmipam's holder label added":            {edit: func(m *metav1.PartialObjectMetadata) { m.Labels[vmipamv1.HolderLabel] = "h" }},
		"deleted, nothing else":                  {edit: deleting, want: true, then: func(m *metav1.PartialObjectMetadata) {}, wantThen: true},
		"deleted, then its spec changed":         {edit: deleting, want: true, then: func(m *metav1.PartialObjectMetadata) { m.Generation++ }},
		"deleted and its spec changed":           {edit: func(m *metav1.PartialObjectMetadata) { deleting(m); m.Generation++ }},
		"deleted and a label changed":            {edit: func(m *metav1.PartialObjectMetadata) { deleting(m); m.Labels["app"] = "y" }},
		"its deletion timestamp went again":      {edit: func(m *metav1.PartialObjectMetadata) { m.Generation++ }, then: deleting},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := &AddressGC{Kind: conditional}
			if tc.noCondition {
				r.Kind = kinds.VirtualMachine
			}
			base := meta(nil)
			obj := &unstructured.Unstructured{}
			obj.SetUID(base.UID)
			obj.SetGeneration(base.Generation)
			obj.SetLabels(base.Labels)
			obj.SetAnnotations(base.Annotations)
			r.noteSettled(t.Context(), obj, facts{notOurs: true}, actWait, 0)
			m := meta(tc.edit)
			if got := r.unchanged(m); got != tc.want {
				t.Errorf("unchanged = %v, want %v", got, tc.want)
			}
			if tc.then != nil {
				tc.then(m)
				if got := r.unchanged(m); got != tc.wantThen {
					t.Errorf("then unchanged = %v, want %v", got, tc.wantThen)
				}
			}
		})
	}
}

// TestNoteSettled: only an unlabelled object without vmipam's marks, for
// which the controller found nothing to do that only a change to it could
// alter, is remembered; anything else forgets it.
func TestNoteSettled(t *testing.T) {
	tests := map[string]struct {
		labels, annotations map[string]string
		f                   facts
		do                  action
		after               time.Duration
		want                bool
	}{
		"out of the kind's scope":        {f: facts{notOurs: true}, do: actWait, want: true},
		"an address that cannot be read": {f: facts{addrErr: errors.New("not an IP")}, do: actInvalidAddress, want: true},
		"no pool for it, retried":        {f: facts{noPool: errors.New("no pool")}, do: actNoPool, after: time.Minute},
		"to be given an address":         {f: facts{}, do: actAssign},
		"waiting on another replica":     {f: facts{}, do: actWait, after: time.Minute},
		"labelled for this replica":      {labels: map[string]string{vmipamv1.HolderLabel: "h"}, f: facts{notOurs: true}, do: actWait},
		"stamped by vmipam":              {annotations: map[string]string{vmipamv1.TokenAnnotation: "t"}, f: facts{notOurs: true}, do: actWait},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := &AddressGC{Kind: kinds.VirtualMachine}
			obj := &unstructured.Unstructured{}
			obj.SetUID("u")
			obj.SetLabels(tc.labels)
			obj.SetAnnotations(tc.annotations)
			if tc.labels[vmipamv1.HolderLabel] == "" {
				// Remembered before: what is not settled now must be
				// forgotten.
				r.settled.Store(obj.GetUID(), settled{})
			}
			r.noteSettled(t.Context(), obj, tc.f, tc.do, tc.after)
			_, got := r.settled.Load(obj.GetUID())
			if got != tc.want {
				t.Errorf("remembered = %v, want %v", got, tc.want)
			}
		})
	}
}
