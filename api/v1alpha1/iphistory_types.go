package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IPHistorySpec is one segment of the history of a chunk of addresses
// (an aligned /24 in IPv4, /120 in IPv6): who held which address when.
// vmipam appends records to a chunk's newest segment, in batches, and
// starts another when it is full; older segments are pruned to the
// configured number of holders per address and the retention.
type IPHistorySpec struct {
	// Pool is the IPPool of the segment's first record.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Pool string `json:"pool,omitempty"`
	// Chunk is the addresses this segment records, a /24 or a /120.
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="chunk is immutable"
	Chunk string `json:"chunk"`
	// Sequence orders the chunk's segments: a higher one is newer.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="sequence is immutable"
	Sequence int64 `json:"sequence"`
	// Records are in the order they were written.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=256
	Records []AddressRecord `json:"records,omitempty"`
}

// AddressRecord is one tenure of an address, or an operator's release of
// it. A tenure runs from when its object was stored with the address to
// when the object's deletion released it.
type AddressRecord struct {
	// Address is the address, in canonical form.
	// +kubebuilder:validation:MaxLength=39
	Address string `json:"address"`
	// Pool is the IPPool it was handed out from.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Pool string `json:"pool,omitempty"`
	// Kind is the holding object's kind as Kind.group, such as
	// VirtualMachine.vmipam.io; empty for an operator's release of an
	// address no object held.
	// +optional
	// +kubebuilder:validation:MaxLength=317
	Kind string `json:"kind,omitempty"`
	// Namespace, Name and UID name the holding object.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=36
	UID string `json:"uid,omitempty"`
	// From is when the object was stored with the address; unset when
	// that is not known (the object was gone when vmipam noticed).
	// +optional
	From *metav1.Time `json:"from,omitempty"`
	// To is when the address was released: the object's deletion, or the
	// operator's release.
	To metav1.Time `json:"to"`
	// Ended is the state the address left: Allocated (its object was
	// deleted), Vanished (its object went without vmipam's finalizer),
	// Pending or Cooldown (ended early by an operator's IPRelease).
	// +kubebuilder:validation:Enum=Allocated;Vanished;Pending;Cooldown
	Ended string `json:"ended"`
	// ReleasedBy is the user whose IPRelease ended it, with Reason.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	ReleasedBy string `json:"releasedBy,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Reason string `json:"reason,omitempty"`
	// Holder is the vmipam replica that recorded it.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Holder string `json:"holder,omitempty"`
}

// The states an AddressRecord says an address left.
const (
	EndedAllocated = "Allocated"
	EndedVanished  = "Vanished"
	EndedPending   = "Pending"
	EndedCooldown  = "Cooldown"
)

// IPHistory is a segment of the address history of a chunk of addresses.
// vmipam writes these objects; `kubectl vmipam history` reads them.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=vmihist
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.pool`
// +kubebuilder:printcolumn:name="Chunk",type=string,JSONPath=`.spec.chunk`
// +kubebuilder:printcolumn:name="Sequence",type=integer,JSONPath=`.spec.sequence`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type IPHistory struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec IPHistorySpec `json:"spec"`
}

// IPHistoryList is a list of IPHistories.
//
// +kubebuilder:object:root=true
type IPHistoryList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPHistory `json:"items"`
}
