package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IPRange is one range of a pool: a CIDR, optionally narrowed to
// [first, last], minus exclusions. The network address, and the broadcast
// address of an IPv4 subnet, are never handed out (except in /31, /32,
// /127 and /128).
//
// +kubebuilder:validation:XValidation:rule="!has(self.first) || !isCIDR(self.cidr) || !isIP(self.first) || cidr(self.cidr).containsIP(self.first)",message="first must lie inside cidr"
// +kubebuilder:validation:XValidation:rule="!has(self.last) || !isCIDR(self.cidr) || !isIP(self.last) || cidr(self.cidr).containsIP(self.last)",message="last must lie inside cidr"
// +kubebuilder:validation:XValidation:rule="!has(self.gateway) || !isCIDR(self.cidr) || !isIP(self.gateway) || cidr(self.cidr).containsIP(self.gateway)",message="must lie inside cidr: a VM reaches only a router on its own subnet",fieldPath=".gateway"
// +kubebuilder:validation:XValidation:rule="!has(self.routes) || has(self.gateway) || self.routes.all(r, has(r.via))",message="a route without via goes through the gateway: set gateway, or via on every route",fieldPath=".routes"
type IPRange struct {
	// CIDR is the subnet, for example 10.0.0.0/16 or fd00::/64.
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="must be a CIDR such as 10.0.0.0/24 or fd00::/64"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self).masked() == cidr(self)",message="host bits are set: write the network address, for example 10.0.0.0/24 rather than 10.0.0.1/24"
	CIDR string `json:"cidr"`
	// First narrows the range to start at this address.
	// +optional
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IP address"
	First string `json:"first,omitempty"`
	// Last narrows the range to end at this address.
	// +optional
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IP address"
	Last string `json:"last,omitempty"`
	// Exclude lists CIDRs or single addresses inside the range that are
	// never handed out.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=43
	Exclude []string `json:"exclude,omitempty"`
	// Gateway is the subnet's router, which vmipam gives each VM of the
	// range beside its address: an address inside cidr (not its network
	// or broadcast address), never handed out.
	// +optional
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IP address, such as 10.0.0.1 or fd00::1"
	Gateway string `json:"gateway,omitempty"`
	// Routes are further routes the VMs of the range get, each through an
	// address inside cidr (the gateway, unless via says otherwise), which
	// is never handed out.
	// +optional
	// +listType=map
	// +listMapKey=destination
	// +kubebuilder:validation:MaxItems=32
	Routes []Route `json:"routes,omitempty"`
}

// Route is a route a VM's guest installs.
type Route struct {
	// Destination is a CIDR of the range's family, such as 10.200.0.0/16,
	// or 0.0.0.0/0 for a default route.
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="must be a CIDR such as 10.200.0.0/16 or fd10::/64"
	Destination string `json:"destination"`
	// Via is the next hop, inside the range's cidr; the range's gateway
	// when left out.
	// +optional
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IP address, such as 10.0.0.1 or fd00::1"
	Via string `json:"via,omitempty"`
}

// Watermarks bound the free list each allocator keeps in memory.
type Watermarks struct {
	// Low: below it the allocator claims more addresses, up to Target.
	// +kubebuilder:validation:Minimum=0
	Low int32 `json:"low"`
	// Target is what the free list is refilled or trimmed to.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4096
	Target int32 `json:"target"`
	// High: above it the allocator returns addresses, down to Target.
	// +kubebuilder:validation:Minimum=1
	High int32 `json:"high"`
}

// NamespaceRestriction lists the namespaces allowed to use a pool: those
// named, and those whose labels match the selector.
//
// +kubebuilder:validation:XValidation:rule="has(self.names) || has(self.selector)",message="name namespaces or give a selector; to allow every namespace, leave allowedNamespaces out"
type NamespaceRestriction struct {
	// Names are namespaces allowed by name.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=63
	Names []string `json:"names,omitempty"`
	// Selector allows the namespaces whose labels match it.
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
}

// IPPoolSpec configures a pool.
//
// +kubebuilder:validation:XValidation:rule="!has(self.watermarks) || (self.watermarks.low <= self.watermarks.target && self.watermarks.target <= self.watermarks.high)",message="watermarks need low <= target <= high"
type IPPoolSpec struct {
	// Ranges are the pool's addresses. Ranges of one pool, and of
	// different pools, must not overlap.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	Ranges []IPRange `json:"ranges"`
	// Cooldown is how long a released address rests before it is handed
	// out again, so that stale routes, ARP and conntrack entries die first.
	// 0s means no cooldown; only a missing field takes the default, 5m.
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="must not be negative; 0s means no cooldown"
	Cooldown *metav1.Duration `json:"cooldown,omitempty"`
	// PendingTTL bounds how long an address handed out at admission waits
	// for its VirtualMachine to be stored; then it goes through cooldown
	// (or back to the free list at once, when vmipam has proved that no
	// object was stored with it). It must be at least 60s, the API server's
	// default request timeout, since the create may still be in flight.
	// +optional
	// +kubebuilder:default="2m"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('60s')",message="must be at least 60s: the API server's default request timeout, during which the create may still be stored"
	PendingTTL *metav1.Duration `json:"pendingTTL,omitempty"`
	// MaxPendingPerNamespace bounds the reservations of one namespace that
	// wait for their VirtualMachine to be stored, so that creates failing
	// after admission in one namespace cannot drain the pool for the
	// others. Unset: an eighth of the pool's usable addresses, and at
	// least 64.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxPendingPerNamespace *int32 `json:"maxPendingPerNamespace,omitempty"`
	// AllowedNamespaces restricts which namespaces may draw from this pool,
	// whether their VirtualMachines name it in spec.ipPool or it is chosen
	// for them. Unset: every namespace may.
	// +optional
	AllowedNamespaces *NamespaceRestriction `json:"allowedNamespaces,omitempty"`
	// Watermarks tune the in-memory free list; the defaults suit most pools.
	// +optional
	Watermarks *Watermarks `json:"watermarks,omitempty"`
	// NamespaceSelector picks the namespaces whose VirtualMachines draw from
	// this pool when they name no pool.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// Default makes this the pool of VirtualMachines that name no pool and
	// match no namespace selector. At most one pool may be the default.
	// +optional
	Default bool `json:"default,omitempty"`
	// Paused stops new allocations from this pool, static requests
	// included, while the addresses already held are left as they are:
	// for draining a range or moving workloads to another pool. Creates
	// that would draw from it are refused, saying so.
	// +optional
	Paused bool `json:"paused,omitempty"`
}

// IPPoolStatus reports a pool's use.
type IPPoolStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Usable is the number of usable addresses in the ranges, capped at the
	// largest int64.
	// +optional
	Usable int64 `json:"usable,omitempty"`
	// Allocated addresses are bound to stored VirtualMachines.
	// +optional
	Allocated int64 `json:"allocated"`
	// Pending addresses were handed out at admission and await their
	// VirtualMachine.
	// +optional
	Pending int64 `json:"pending"`
	// Free addresses are claimed by the allocator and ready.
	// +optional
	Free int64 `json:"free"`
	// Cooldown addresses were released and rest before reuse.
	// +optional
	Cooldown int64 `json:"cooldown"`
	// Families gives the counts of each address family, for a pool with
	// ranges of both.
	// +optional
	// +listType=map
	// +listMapKey=family
	Families []FamilyStatus `json:"families,omitempty"`
	// Trend is how the pool's allocated and pending addresses changed
	// over the last hour, from which `kubectl vmipam pools` works out the
	// time to exhaustion.
	// +optional
	Trend *Trend `json:"trend,omitempty"`
	// Conditions: Ready (the allocator has recovered and serves), Exhausted
	// (no address, or none of one family, can be handed out now), DuplicateAddress (two live
	// VirtualMachines carry one address).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// FamilyStatus is a pool's use of one address family.
type FamilyStatus struct {
	// Family is IPv4 or IPv6.
	Family IPFamily `json:"family"`
	// Usable, Allocated, Pending, Free and Cooldown count the family's
	// addresses as the pool's own counts do.
	Usable    int64 `json:"usable"`
	Allocated int64 `json:"allocated"`
	Pending   int64 `json:"pending"`
	Free      int64 `json:"free"`
	Cooldown  int64 `json:"cooldown"`
	// Trend is the family's, as the pool's.
	// +optional
	Trend *Trend `json:"trend,omitempty"`
}

// Trend is the change of a pool's allocated and pending addresses over a
// window that ends at the status write: the last hour, or less while the
// replica writing the status has not watched the pool that long.
type Trend struct {
	// Window is how far back the change is measured.
	Window metav1.Duration `json:"window"`
	// Change is allocated plus pending now, minus the same a window ago.
	Change int64 `json:"change"`
}

// Condition types of an IPPool.
const (
	ConditionReady            = "Ready"
	ConditionExhausted        = "Exhausted"
	ConditionDuplicateAddress = "DuplicateAddress"
	// ConditionPaused is True while spec.paused stops new allocations.
	ConditionPaused = "Paused"
)

// IPPool is a pool of addresses handed to VirtualMachines. Its short name
// is vmipool, not ipp or ippool: Calico, Whereabouts, Kube-OVN and NeonVM
// install ippools too (test/deploy's names_test.go lists their names), and
// it is in the category vmipam (kubectl get vmipam).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=vmipool,categories=vmipam
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Usable",type=integer,JSONPath=`.status.usable`
// +kubebuilder:printcolumn:name="Allocated",type=integer,JSONPath=`.status.allocated`
// +kubebuilder:printcolumn:name="Pending",type=integer,JSONPath=`.status.pending`
// +kubebuilder:printcolumn:name="Cooldown",type=integer,JSONPath=`.status.cooldown`
// +kubebuilder:printcolumn:name="Free",type=integer,JSONPath=`.status.free`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Exhausted",type=string,JSONPath=`.status.conditions[?(@.type=="Exhausted")].status`
// +kubebuilder:printcolumn:name="Paused",type=boolean,JSONPath=`.spec.paused`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type IPPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   IPPoolSpec   `json:"spec"`
	Status IPPoolStatus `json:"status,omitempty"`
}

// IPPoolList is a list of IPPools.
//
// +kubebuilder:object:root=true
type IPPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPPool `json:"items"`
}
