package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IPBlockSpec is the persisted state of one block of 4096 addresses of a
// pool: which allocator replica (holder) claimed which address, and the
// cooldown deadlines of released ones. Allocations are not here: they live
// on the VirtualMachines. The format is ipam.EncodedBlock's.
type IPBlockSpec struct {
	// Pool is the IPPool the block belongs to.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="pool is immutable"
	Pool string `json:"pool"`
	// Prefix is the block, a /20 in IPv4 or a /116 in IPv6.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="prefix is immutable"
	// +kubebuilder:validation:MaxLength=43
	Prefix string `json:"prefix"`
	// Claims maps a holder to the base64 bitmap of the offsets it claimed.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Claims map[string]string `json:"claims,omitempty"`
	// InUse maps a holder to the bitmap of its claimed offsets pending or
	// allocated at its last write; Armed, to those it may hand out before
	// it writes again. Recovery rests these and frees the rest.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	InUse map[string]string `json:"inUse,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Armed map[string]string `json:"armed,omitempty"`
	// Requests maps a holder to what it asks the block's other holders to
	// hand over.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Requests map[string]IPBlockRequest `json:"requests,omitempty"`
	// Format is 2 once InUse and Armed are recorded.
	// +optional
	Format int32 `json:"format,omitempty"`
	// Shares are the holders whose in-use and armed addresses and
	// cooldowns in this block are kept in an IPBlockShare that only that
	// holder writes, not here. For each of them, InUse here lists every
	// address it claims, so that a replica of a version before shares
	// existed reads all of them as possibly in use. A replica of such a
	// version drops this list when it writes the block; the holders'
	// addresses are then read that way, until each writes the block again.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	Shares []string `json:"shares,omitempty"`
	// Cooldowns is base64 of (uint16 offset, int64 Unix seconds) records.
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	Cooldowns string `json:"cooldowns,omitempty"`
}

// IPBlockRequest is a holder's request for addresses of a block: a count
// of any free ones, and the base64 bitmap of specific ones.
type IPBlockRequest struct {
	// +optional
	Count int32 `json:"count,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Addrs string `json:"addrs,omitempty"`
	// Refused says, by the offset of an address in the block, why its
	// holder did not hand it over: "allocated <namespace/name>", "pending
	// <namespace/name>" or "cooldown <RFC 3339 time>". The requester reads
	// it and takes it out. A replica of an older version drops it when it
	// writes the block; the requester then says only that the address is
	// in use.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, self[k].size() <= 400)",message="a refusal is at most 400 characters"
	Refused map[string]string `json:"refused,omitempty"`
}

// IPBlock persists the allocator's claims and cooldowns for one block of a
// pool. vmipam manages these objects; do not edit them.
//
// It is not in the category vmipam: `kubectl get vmipam` lists what an
// operator reads and acts on, and blocks are vmipam's bookkeeping (kubectl
// vmipam pools sums them up).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.pool`
// +kubebuilder:printcolumn:name="Prefix",type=string,JSONPath=`.spec.prefix`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type IPBlock struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec IPBlockSpec `json:"spec"`
}

// IPBlockList is a list of IPBlocks.
//
// +kubebuilder:object:root=true
type IPBlockList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPBlock `json:"items"`
}
