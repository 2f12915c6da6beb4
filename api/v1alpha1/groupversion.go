package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of these types.
	GroupVersion = schema.GroupVersion{Group: "vmipam.io", Version: "v1alpha1"}

	// SchemeBuilder registers these types with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds these types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&IPPool{}, &IPPoolList{},
		&IPBlock{}, &IPBlockList{},
		&IPBlockShare{}, &IPBlockShareList{},
		&VirtualMachine{}, &VirtualMachineList{},
		&IPHistory{}, &IPHistoryList{},
		&IPRelease{}, &IPReleaseList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Well-known annotations, labels and finalizers.
const (
	// TokenAnnotation holds the reservation token the webhook stamped: the
	// key of the pending reservation until the controller binds it to the
	// object's UID.
	TokenAnnotation = "vmipam.io/token"
	// PoolAnnotation names the IPPool the address was taken from.
	PoolAnnotation = "vmipam.io/pool"
	// AddressAnnotation records the address vmipam stamped at admission, so
	// that the validating webhook (on any replica, holding no state) can
	// tell that no later admission step changed it.
	AddressAnnotation = "vmipam.io/address"
	// SingleStackAnnotation says why a VirtualMachine that asked for
	// PreferDualStack got an address of one family only; the controller
	// reports it in an event when it binds the address.
	SingleStackAnnotation = "vmipam.io/single-stack"
	// Finalizer keeps a VirtualMachine until its address is released into
	// cooldown.
	Finalizer = "vmipam.io/release-address"
	// PoolFinalizer keeps an IPPool, once deleted, until no VirtualMachine
	// holds or waits for one of its addresses and its cooldowns have ended,
	// so that no address is stranded or handed out again too early by a
	// pool created over the same ranges.
	PoolFinalizer = "vmipam.io/ippool-protection"
	// PoolLabel on an IPBlock or an IPBlockShare names its pool.
	PoolLabel = "vmipam.io/pool"
	// BlockLabel on an IPBlockShare stands for its block: a hash of the
	// IPBlock's name (see kubestore.BlockLabelValue).
	BlockLabel = "vmipam.io/block"
	// HolderLabel on a VirtualMachine names the vmipam replica (holder)
	// that looks after its address: each replica watches only the objects
	// labelled with its own holder, and those with no such label. vmipam
	// sets it at admission and moves it when a replica takes another's
	// claims over; a changed or removed label is put back by the holder's
	// next resync.
	HolderLabel = "vmipam.io/holder"
	// ChunkLabel on an IPHistory stands for its chunk of addresses (see
	// history.ChunkLabelValue), so that the segments of one chunk are
	// listed by it.
	ChunkLabel = "vmipam.io/chunk"
)
