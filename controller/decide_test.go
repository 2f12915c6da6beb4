package controller

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/vmipam/vmipam/pools"
)

// TestDecide: the garbage collector's decisions over what it knows of an
// object, without a client.
func TestDecide(t *testing.T) {
	pool := &pools.Pool{}
	one := []netip.Addr{netip.MustParseAddr("10.0.0.5")}
	ready := func(f facts) facts { f.pool, f.poolReady = pool, true; return f }
	tests := map[string]struct {
		f     facts
		want  action
		after time.Duration
	}{
		"an address that cannot be read":                        {f: facts{addrErr: errors.New("not an IP")}, want: actInvalidAddress},
		"not vmipam's":                                          {f: facts{notOurs: true}, want: actWait},
		"no pool for an object without an address":              {f: facts{noPool: errors.New("no default pool")}, want: actNoPool, after: time.Minute},
		"no pool yet, a retry will do, the object young":        {f: facts{noPool: errors.New("just created"), retry: true}, want: actWait, after: time.Second},
		"deleted, its pool unknown while pools recover":         {f: facts{deleted: true, finalizer: true, poolsUnknown: true}, want: actWait, after: time.Second},
		"deleted, its pool gone":                                {f: facts{deleted: true, finalizer: true}, want: actRemoveFinalizer},
		"an address outside every pool":                         {f: facts{addrs: one}, want: actWait},
		"an address in a pool being built":                      {f: facts{addrs: one, poolComing: true}, want: actWait, after: time.Second},
		"deleted, its pool being built, its pools unknown":      {f: facts{addrs: one, poolComing: true, deleted: true, finalizer: true, poolsUnknown: true}, want: actWait, after: time.Second},
		"no address, no pool yet":                               {f: facts{}, want: actWait, after: 10 * time.Second},
		"no address, no pool, going without vmipam's finalizer": {f: facts{deleted: true}, want: actWait},
		"its pool recovering":                                   {f: facts{addrs: one, pool: pool}, want: actWait, after: time.Second},
		"another live replica's":                                {f: ready(facts{addrs: one, keeper: pools.KeeperPeer}), want: actWait, after: time.Minute},
		"another live replica's, being deleted":                 {f: ready(facts{addrs: one, keeper: pools.KeeperPeer, deleted: true, finalizer: true}), want: actWait, after: 5 * time.Second},
		"unclaimed, another replica chosen":                     {f: ready(facts{addrs: one, keeper: pools.KeeperNotChosen}), want: actWait, after: time.Minute},
		"a leaving replica's":                                   {f: ready(facts{addrs: one, keeper: pools.KeeperLeaving}), want: actWait, after: 5 * time.Second},
		"unclaimed, being deleted":                              {f: ready(facts{addrs: one, keeper: pools.KeeperUnclaimed, deleted: true, finalizer: true}), want: actRemoveFinalizer},
		"unclaimed, being deleted, finalizer gone":              {f: ready(facts{addrs: one, keeper: pools.KeeperUnclaimed, deleted: true}), want: actWait},
		"unclaimed, live: this replica claims it":               {f: ready(facts{addrs: one, keeper: pools.KeeperUnclaimed}), want: actKeep},
		"mine, being deleted":                                   {f: ready(facts{addrs: one, keeper: pools.KeeperMine, deleted: true, finalizer: true}), want: actRelease},
		"mine, being deleted, finalizer gone":                   {f: ready(facts{addrs: one, keeper: pools.KeeperMine, deleted: true}), want: actWait},
		"mine, live":                                            {f: ready(facts{addrs: one, keeper: pools.KeeperMine}), want: actKeep},
		"no address, being deleted in a known pool":             {f: ready(facts{deleted: true, finalizer: true}), want: actRelease},
		"no address, this replica chosen":                       {f: ready(facts{chosen: true}), want: actAssign},
		"no address, another replica chosen":                    {f: ready(facts{}), want: actWait, after: time.Minute},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, after := decide(tc.f)
			if got != tc.want || after != tc.after {
				t.Errorf("decide = %v after %v, want %v after %v", got, after, tc.want, tc.after)
			}
		})
	}
}
