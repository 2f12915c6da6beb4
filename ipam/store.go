package ipam

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"sync"
)

// Store persists a pool's blocks. Implementations must make Put a
// compare-and-swap on Block.Version so that several writers cannot lose each
// other's updates; the Manager re-reads and retries, with a bound, on
// ErrStoreConflict. The Manager never calls a Store while holding the lock
// that allocations take.
type Store interface {
	// List returns every persisted block of the pool.
	List(ctx context.Context) ([]Block, error)
	// Get returns one block; a block that does not exist is returned with an
	// empty Version and no error.
	Get(ctx context.Context, prefix netip.Prefix) (Block, error)
	// Put writes b if its Version is still current (an empty Version
	// creates the block) and returns the new version. A stale version
	// returns an error matching ErrStoreConflict and writes nothing.
	Put(ctx context.Context, b Block) (string, error)
	// Delete removes the block if its version is still version, so that a
	// block nobody claims anything in leaves nothing behind. A stale
	// version returns an error matching ErrStoreConflict and deletes
	// nothing; a block already gone is no error.
	Delete(ctx context.Context, prefix netip.Prefix, version string) error
}

// MemoryStore is a Store held in memory, for tests, examples and
// single-process use. It is safe for concurrent use.
type MemoryStore struct {
	mu     sync.Mutex
	blocks map[netip.Prefix]Block
	seq    int
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{blocks: map[netip.Prefix]Block{}}
}

// List implements Store.
func (s *MemoryStore) List(context.Context) ([]Block, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Block, 0, len(s.blocks))
	for _, p := range slices.SortedFunc(maps.Keys(s.blocks), netip.Prefix.Compare) {
		out = append(out, s.blocks[p].Clone())
	}
	return out, nil
}

// Get implements Store.
func (s *MemoryStore) Get(_ context.Context, prefix netip.Prefix) (Block, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.blocks[prefix]
	if !ok {
		return Block{Prefix: prefix}, nil
	}
	return b.Clone(), nil
}

// Put implements Store.
func (s *MemoryStore) Put(_ context.Context, b Block) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.blocks[b.Prefix]
	if cur.Version != b.Version || (!ok && b.Version != "") {
		return "", fmt.Errorf("put block %s at version %q (current %q): %w", b.Prefix, b.Version, cur.Version, ErrStoreConflict)
	}
	s.seq++
	b = b.Clone()
	b.Version = strconv.Itoa(s.seq)
	s.blocks[b.Prefix] = b
	return b.Version, nil
}

// Delete implements Store.
func (s *MemoryStore) Delete(_ context.Context, prefix netip.Prefix, version string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.blocks[prefix]
	if !ok {
		return nil
	}
	if cur.Version != version {
		return fmt.Errorf("delete block %s at version %q (current %q): %w", prefix, version, cur.Version, ErrStoreConflict)
	}
	delete(s.blocks, prefix)
	s.seq++
	return nil
}

// Len returns how many blocks the store holds.
func (s *MemoryStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.blocks)
}

// Touch bumps a block's version without changing it, as a concurrent writer
// would; tests use it to provoke conflicts.
func (s *MemoryStore) Touch(prefix netip.Prefix) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.blocks[prefix]; ok {
		s.seq++
		b.Version = strconv.Itoa(s.seq)
		s.blocks[prefix] = b
	}
}
