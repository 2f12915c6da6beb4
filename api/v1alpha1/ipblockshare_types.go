package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IPBlockShareSpec is one holder's part of an IPBlock: of the addresses
// the holder claims in the block, those pending or allocated at its last
// write, those it may hand out before it writes again (armed), and the
// cooldown deadlines of those it released. Only that holder writes it, so
// that handing out and releasing addresses never competes with the
// block's other holders; the IPBlock keeps the claims and hand-overs, and
// lists the holder in spec.shares. The format is ipam.EncodedBlock's.
type IPBlockShareSpec struct {
	// Pool is the IPPool the block belongs to.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="pool is immutable"
	Pool string `json:"pool"`
	// Prefix is the block, a /20 in IPv4 or a /116 in IPv6.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="prefix is immutable"
	// +kubebuilder:validation:MaxLength=43
	Prefix string `json:"prefix"`
	// Holder is the vmipam replica whose part this is.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="holder is immutable"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Holder string `json:"holder"`
	// InUse is the base64 bitmap of the holder's claimed offsets pending
	// or allocated at its last write; Armed, of those it may hand out
	// before it writes again. Recovery rests these and frees the rest.
	// +optional
	// +kubebuilder:validation:MaxLength=684
	InUse string `json:"inUse,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=684
	Armed string `json:"armed,omitempty"`
	// Cooldowns is base64 of (uint16 offset, int64 Unix seconds) records.
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	Cooldowns string `json:"cooldowns,omitempty"`
}

// IPBlockShare persists one vmipam replica's in-use and armed addresses
// and cooldowns in one IPBlock. vmipam manages these objects; do not edit
// them.
//
// It is not in the category vmipam: `kubectl get vmipam` lists what an
// operator reads and acts on, and blocks are vmipam's bookkeeping (kubectl
// vmipam pools sums them up).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.pool`
// +kubebuilder:printcolumn:name="Prefix",type=string,JSONPath=`.spec.prefix`
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.spec.holder`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type IPBlockShare struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec IPBlockShareSpec `json:"spec"`
}

// IPBlockShareList is a list of IPBlockShares.
//
// +kubebuilder:object:root=true
type IPBlockShareList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPBlockShare `json:"items"`
}
