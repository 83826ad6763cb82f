package store

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// ErrNotLeader is a fenced write refused: the writer's election key is gone (its lease
// expired or was revoked) or belongs to a newer campaign, so another replica may lead.
var ErrNotLeader = errors.New("not the leader any more: the election key this replica won with is gone")

// Fence is the election key a leader won with. A write fenced by it commits only while
// that key exists with that creation revision: a replica whose lease expired can never
// write after another has taken over, however late its request arrives.
type Fence struct {
	Key string
	Rev int64
}

// FenceOf is the fence of a won election.
func FenceOf(e *concurrency.Election) Fence { return Fence{Key: e.Key(), Rev: e.Rev()} }

// maxTxnOps stays under etcd's default of 128 operations per transaction (one is the
// revision key's).
const maxTxnOps = 100

// WriteVerdicts stores puts and deletes dels in fenced transactions of at most maxTxnOps
// operations (one for a burst of a hundred transitions: one new version for the fleet).
// It returns ErrNotLeader when the fence fails; what earlier batches wrote stays.
func WriteVerdicts(ctx context.Context, cli *clientv3.Client, k Keys, f Fence, puts map[VerdictKey]Verdict, dels []VerdictKey, c Change) error {
	var ops []clientv3.Op
	for _, vk := range sortedKeys(puts) {
		ops = append(ops, clientv3.OpPut(k.Verdict(vk), puts[vk].marshal()))
	}
	for _, vk := range dels {
		ops = append(ops, clientv3.OpDelete(k.Verdict(vk)))
	}
	if c.At.IsZero() {
		c.At = time.Now()
	}
	c.At = c.At.UTC()
	meta, _ := json.Marshal(c)
	for len(ops) > 0 {
		n := min(len(ops), maxTxnOps)
		batch := append(slices.Clip(ops[:n]), clientv3.OpPut(k.Revision(), string(meta)))
		r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(f.Key), "=", f.Rev)).Then(batch...).Commit()
		if err != nil {
			return fmt.Errorf("writing verdicts: %w", err)
		}
		if !r.Succeeded {
			return ErrNotLeader
		}
		ops = ops[n:]
	}
	return nil
}

// MarkRevision puts the revision key, fenced as WriteVerdicts: after another client's
// delete under the state prefix (State.Unmarked), so that a replica reading the state
// whole takes the revision a replica following it by watch has (see State).
func MarkRevision(ctx context.Context, cli *clientv3.Client, k Keys, f Fence, c Change) error {
	if c.At.IsZero() {
		c.At = time.Now()
	}
	c.At = c.At.UTC()
	meta, _ := json.Marshal(c)
	r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(f.Key), "=", f.Rev)).Then(clientv3.OpPut(k.Revision(), string(meta))).Commit()
	if err != nil {
		return fmt.Errorf("marking the state's revision: %w", err)
	}
	if !r.Succeeded {
		return ErrNotLeader
	}
	return nil
}

func sortedKeys(m map[VerdictKey]Verdict) []VerdictKey {
	out := slices.Collect(maps.Keys(m))
	slices.SortFunc(out, func(a, b VerdictKey) int {
		return cmp.Or(strings.Compare(a.Service, b.Service), strings.Compare(a.ID, b.ID))
	})
	return out
}

// Member is one replica in the election: every live replica holds a key there (the
// leader's is the oldest).
type Member struct {
	ID string `json:"id"`
	// Key is its election key; Rev the key's creation revision.
	Key string `json:"-"`
	Rev int64  `json:"-"`
}

// Members lists the replicas in the election, the leader first (one linearizable read:
// it doubles as the store's heartbeat).
func Members(ctx context.Context, cli *clientv3.Client, k Keys) ([]Member, int64, error) {
	r, err := cli.Get(ctx, k.Election(), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, 0, err
	}
	out := make([]Member, 0, len(r.Kvs))
	for _, kv := range r.Kvs {
		out = append(out, Member{ID: string(kv.Value), Key: string(kv.Key), Rev: kv.CreateRevision})
	}
	return out, r.Header.Revision, nil
}
