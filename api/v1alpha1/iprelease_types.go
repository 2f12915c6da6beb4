package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IPReleaseSpec asks vmipam to end an address's pending reservation now,
// or its cooldown early. The replica whose claim holds the address acts;
// it refuses while a live object holds the address.
//
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="an IPRelease cannot be changed; create another"
// +kubebuilder:validation:XValidation:rule="!has(self.skipCooldown) || !self.skipCooldown || has(self.reason) && size(self.reason) > 0",message="skipCooldown needs a reason, recorded in the address's history"
type IPReleaseSpec struct {
	// Address is the address to release, in canonical form.
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self) && string(ip(self)) == self",message="must be an IP address in canonical form, such as 10.0.0.5 or fd00::5"
	Address string `json:"address"`
	// SkipCooldown frees the address at once: a pending reservation is
	// freed without its cooldown, a cooldown is ended. Without it, a
	// pending reservation goes into its cooldown and a cooldown is left
	// to run.
	// +optional
	SkipCooldown bool `json:"skipCooldown,omitempty"`
	// Reason is recorded in the address's history.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Reason string `json:"reason,omitempty"`
	// RequestedBy is the user who created the IPRelease, set by vmipam's
	// admission webhook from the request (whatever the creator wrote).
	// +optional
	// +kubebuilder:validation:MaxLength=512
	RequestedBy string `json:"requestedBy,omitempty"`
}

// IPReleaseStatus says what vmipam did.
type IPReleaseStatus struct {
	// Phase is Done or Refused once a replica acted; empty until then.
	// +optional
	// +kubebuilder:validation:Enum=Done;Refused
	Phase string `json:"phase,omitempty"`
	// Message says what was done, or why not and what to do.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
	// Holder is the replica that acted.
	// +optional
	Holder string `json:"holder,omitempty"`
	// Pool is the address's pool.
	// +optional
	Pool string `json:"pool,omitempty"`
	// Previous is the state the address was in: Pending, Cooldown,
	// Allocated, Free.
	// +optional
	Previous string `json:"previous,omitempty"`
	// CompletionTime is when it acted; vmipam deletes the IPRelease an
	// hour after.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// The phases of an IPRelease.
const (
	ReleaseDone    = "Done"
	ReleaseRefused = "Refused"
)

// IPRelease asks vmipam to release a stuck address: `kubectl vmipam
// release` creates one and waits for its status.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=vmipam,shortName=vmirel
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.spec.address`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="By",type=string,JSONPath=`.spec.requestedBy`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type IPRelease struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   IPReleaseSpec   `json:"spec"`
	Status IPReleaseStatus `json:"status,omitempty"`
}

// IPReleaseList is a list of IPReleases.
//
// +kubebuilder:object:root=true
type IPReleaseList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPRelease `json:"items"`
}
