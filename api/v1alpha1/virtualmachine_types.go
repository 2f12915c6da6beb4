package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// VirtualMachineSpec is a minimal reference virtual machine: enough to
// show where vmipam stamps the address. The API server keeps the address
// immutable once assigned (this rule, and the ValidatingAdmissionPolicy
// that `vmipam manifests` renders, which also covers vmipam's
// annotations), with no call to vmipam.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.addresses) || size(oldSelf.addresses) == 0 || (has(self.addresses) && self.addresses == oldSelf.addresses)",message="spec.addresses is immutable once assigned; delete and recreate the VirtualMachine to get another address"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.network) || has(self.network) && self.network == oldSelf.network",message="spec.network is written by vmipam with the address and immutable once set; delete and recreate the VirtualMachine to change it"
type VirtualMachineSpec struct {
	// IPPool names the pool to draw the address from; empty picks the
	// pool by namespace selector, then the default pool.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	IPPool string `json:"ipPool,omitempty"`
	// Addresses are the VM's IP addresses, at most one per family, the
	// primary family's first. Leave empty to be given them; set one or one
	// of each family to ask for those, written in canonical form (10.0.0.5,
	// fd00::5; not ::ffff:10.0.0.5, FD00:0::5 or a zone), alone or with
	// the prefix length of their subnet (10.0.0.5/24), which vmipam drops.
	// Immutable once set.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:MaxLength=39
	// +kubebuilder:validation:items:XValidation:rule="isIP(self) && string(ip(self)) == self",message="must be an IP address in canonical form, such as 10.0.0.5 or fd00::5: no IPv4-mapped IPv6 form (::ffff:10.0.0.5), no zone, lower case, zeros compressed"
	// +kubebuilder:validation:XValidation:rule="size(self) < 2 || !isIP(self[0]) || !isIP(self[1]) || ip(self[0]).family() != ip(self[1]).family()",message="holds one address per family: an IPv4 and an IPv6 one"
	Addresses []string `json:"addresses,omitempty"`
	// IPFamilyPolicy says how many families the VM gets an address of, as
	// a Service's does: SingleStack (the default) one, PreferDualStack both
	// where the pool has both free (else what it can, said in an event),
	// RequireDualStack both or the create fails. Read when the VM is
	// created.
	// +optional
	IPFamilyPolicy *IPFamilyPolicy `json:"ipFamilyPolicy,omitempty"`
	// IPFamilies orders the families, the primary first; unset, IPv4
	// first (or the family of a static request). A SingleStack VM gets an
	// address of the first.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:XValidation:rule="size(self) < 2 || self[0] != self[1]",message="names each family once"
	IPFamilies []IPFamily `json:"ipFamilies,omitempty"`
	// Network is what the guest needs to configure its interface, which
	// vmipam writes beside the address when it assigns one: each address
	// with its prefix length, the gateways and the routes of its range.
	// A guest agent or cloud-init reads it; vmipam keeps it as written.
	// +optional
	Network *Network `json:"network,omitempty"`
	// Image is what the VM boots; vmipam does not look at it.
	// +optional
	Image string `json:"image,omitempty"`
	// CPUs and Memory size the VM; vmipam does not look at them.
	// +optional
	CPUs int32 `json:"cpus,omitempty"`
	// +optional
	Memory string `json:"memory,omitempty"`
}

// Network is a VM's network identity: the interface configuration of its
// addresses, in the shape cloud-init's network configuration takes.
type Network struct {
	// Addresses are the VM's addresses in interface notation, the address
	// and its subnet's prefix length (10.0.0.5/24), in the order of
	// spec.addresses.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:MaxLength=43
	Addresses []string `json:"addresses,omitempty"`
	// Gateways are the routers of the addresses' subnets, at most one per
	// family; a guest routes what no other route covers through them.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:MaxLength=39
	Gateways []string `json:"gateways,omitempty"`
	// Routes are the further routes of the addresses' subnets, each with
	// its next hop.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Routes []Route `json:"routes,omitempty"`
}

// IPFamilyPolicy says how many address families a VM gets an address of.
// +kubebuilder:validation:Enum=SingleStack;PreferDualStack;RequireDualStack
type IPFamilyPolicy string

// The family policies, as a Service's.
const (
	SingleStack      IPFamilyPolicy = "SingleStack"
	PreferDualStack  IPFamilyPolicy = "PreferDualStack"
	RequireDualStack IPFamilyPolicy = "RequireDualStack"
)

// IPFamily is an address family.
// +kubebuilder:validation:Enum=IPv4;IPv6
type IPFamily string

// The address families.
const (
	IPv4 IPFamily = "IPv4"
	IPv6 IPFamily = "IPv6"
)

// VirtualMachineStatus is the VM's observed state.
type VirtualMachineStatus struct {
	// Conditions of the VM.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// VirtualMachine is a virtual machine that receives an address from vmipam.
// Its short name is vmivm, not vm: KubeVirt's VirtualMachine has vm and
// vms, and NeonVM's is virtualmachines too (test/deploy's names_test.go
// lists their names). It is in the category vmipam (kubectl get vmipam).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=vmivm,categories=vmipam
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Addresses",type=string,JSONPath=`.spec.addresses`
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.metadata.annotations.vmipam\.io/pool`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type VirtualMachine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VirtualMachineSpec   `json:"spec,omitempty"`
	Status VirtualMachineStatus `json:"status,omitempty"`
}

// VirtualMachineList is a list of VirtualMachines.
//
// +kubebuilder:object:root=true
type VirtualMachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachine `json:"items"`
}
