// Package audit is the logic of `kubectl vmipam check`: a read-only
// consistency report on vmipam's state, read from the API server alone.
//
// A check gathers the cluster into a snapshot (the objects of the
// configured kinds first, then the IPPools, IPBlocks, IPBlockShares and
// holder Leases, then the objects of other kinds that carry vmipam's
// marks), decides on that snapshot in a pure function which findings it
// shows, and confirms them: it reads everything again, decides again, and
// keeps only the findings both reads show. Every rule that could fire on a
// cluster busy creating and deleting objects, with replicas restarting,
// says in a comment where it is written why it does not.
//
// It never writes: each finding carries the fix an operator can apply.
package audit

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/kinds"
)

// The finding types.
const (
	// TypeDuplicateAddress: two live objects carry one address.
	TypeDuplicateAddress = "DuplicateAddress"
	// TypeNoAddress: a live object in scope carries no address.
	TypeNoAddress = "NoAddress"
	// TypeLeak: an address the persisted state shows in use that no
	// object carries, past the pool's pending TTL.
	TypeLeak = "Leak"
	// TypeDeadHolderClaims: claims of a holder whose Lease is gone or
	// lapsed, and that no live replica is taking over.
	TypeDeadHolderClaims = "DeadHolderClaims"
	// TypeHolderLabelMismatch: an object's holder label names another
	// holder than the one whose claim covers its address.
	TypeHolderLabelMismatch = "HolderLabelMismatch"
	// TypeUnconfiguredKind: an object carrying vmipam's holder label, of a
	// kind no replica serves.
	TypeUnconfiguredKind = "UnconfiguredKind"
	// TypeUnknownBlock: an IPBlock of no IPPool, claims outside the
	// pool's ranges, or an IPBlockShare without its IPBlock.
	TypeUnknownBlock = "UnknownBlock"
)

// DefaultNamespace is vmipam's namespace, where the holder Leases live.
const DefaultNamespace = "vmipam-system"

// DefaultGrace is Options.Grace when it is zero.
const DefaultGrace = 30 * time.Second

// Sources are where audit reads the cluster.
type Sources struct {
	// Reader reads vmipam's objects and the configured kinds' objects; it
	// must read from the API server, not from a cache: the confirmation
	// relies on fresh reads.
	Reader client.Reader
	// Discovery lists the cluster's resources and Metadata lists their
	// objects' metadata, to find the objects of kinds no replica serves;
	// with either nil, that finding is not looked for.
	Discovery discovery.DiscoveryInterface
	Metadata  metadata.Interface
}

// Options tune a check.
type Options struct {
	// Kinds are the kinds vmipam serves; nil reads them from the holder
	// Leases' pools.KindsAnnotation (JSON of []kinds.Kind), else
	// kinds.Default().
	Kinds []kinds.Kind
	// Namespace is vmipam's namespace, where the holder Leases live;
	// default DefaultNamespace.
	Namespace string
	// Grace is added to a pool's pending TTL before an address no object
	// holds counts as leaked, and to the other waits of the rules (clock
	// skew, a watch's delay); default DefaultGrace.
	Grace time.Duration
}

// Finding is one inconsistency and its fix.
type Finding struct {
	// Type is one of the Type constants.
	Type string
	// Pool, Address, Object (kind namespace/name) and Holder say what it
	// is about, where they apply.
	Pool, Address, Object, Holder string
	// Message says what is wrong, naming the object, address and pool.
	Message string
	// Fix says what an operator can do about it.
	Fix string
}

// key identifies a finding across the two reads of a check.
func (f Finding) key() string {
	return strings.Join([]string{f.Type, f.Pool, f.Address, f.Object, f.Holder}, "\x00")
}

// Report is a check's result.
type Report struct {
	// Findings are the confirmed findings, sorted by type, pool, address
	// and object.
	Findings []Finding
	// Objects, Blocks and Addresses count what the check looked at: the
	// objects of the configured kinds, the IPBlocks, and the addresses
	// the objects carry.
	Objects, Blocks, Addresses int
}

// Run checks the cluster: it gathers a snapshot, decides, and confirms the
// findings with a second, fresh read (see the package comment).
func Run(ctx context.Context, src Sources, opts Options) (Report, error) {
	if src.Reader == nil {
		return Report{}, fmt.Errorf("check: no reader")
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.Grace <= 0 {
		opts.Grace = DefaultGrace
	}
	first, err := gather(ctx, src, opts)
	if err != nil {
		return Report{}, err
	}
	found := decide(first)
	rep := Report{Objects: len(first.objects), Blocks: first.ipblocks}
	for _, o := range first.objects {
		rep.Addresses += len(o.addrs)
	}
	if len(found) == 0 {
		return rep, nil
	}
	confirmed, err := confirm(ctx, src, opts, found)
	if err != nil {
		return Report{}, err
	}
	rep.Findings = confirmed
	return rep, nil
}

// confirm reads the cluster again and keeps the findings that its
// decision shows too. Every read is a fresh one from the API server (a
// list without a resourceVersion is a quorum read, as fresh as a GET), and
// a finding rests on objects, blocks and Leases that are all read again:
// one that held only in the first read (an object deleted between the
// lists of two kinds, a block written between two reads, a Lease renewed)
// goes. The message of the second read is kept, its times being the
// later.
func confirm(ctx context.Context, src Sources, opts Options, found []Finding) ([]Finding, error) {
	second, err := gather(ctx, src, opts)
	if err != nil {
		return nil, fmt.Errorf("confirm: %w", err)
	}
	was := map[string]bool{}
	for _, f := range found {
		was[f.key()] = true
	}
	var out []Finding
	for _, f := range decide(second) {
		if was[f.key()] {
			out = append(out, f)
		}
	}
	return out, nil
}

// sortFindings orders findings by type, pool, address, object and holder.
func sortFindings(fs []Finding) {
	slices.SortFunc(fs, func(a, b Finding) int { return strings.Compare(a.key(), b.key()) })
}
