package audit

import (
	"context"
	"fmt"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/proof"
	bolt "go.etcd.io/bbolt"
)

// The tiles bucket holds the hashes of the tree levels 0, 8, 16, … (the
// C2SP hash tiles), so a proof is O(log n) reads: the node IDs come from the
// merkle proof package; a node between tile levels is rehashed from at most
// 128 stored hashes, and the one ephemeral node of a proof from its
// non-ephemeral children.

// InclusionProof returns the RFC 6962 inclusion proof of the entry at index
// in the tree of treeSize (≤ Size()), as proof.VerifyInclusion takes it.
func (l *Log) InclusionProof(ctx context.Context, index, treeSize uint64) ([][]byte, error) {
	if err := l.checkSize(treeSize); err != nil {
		return nil, err
	}
	if index >= treeSize {
		return nil, fmt.Errorf("%w: index %d, tree size %d", ErrTreeSize, index, treeSize)
	}
	nodes, err := proof.Inclusion(index, treeSize)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTreeSize, err)
	}
	return l.fetchProof(ctx, nodes)
}

// ConsistencyProof returns the RFC 6962 consistency proof between tree
// sizes from ≤ to ≤ Size(), as proof.VerifyConsistency takes it.
func (l *Log) ConsistencyProof(ctx context.Context, from, to uint64) ([][]byte, error) {
	if err := l.checkSize(to); err != nil {
		return nil, err
	}
	if from > to {
		return nil, fmt.Errorf("%w: from %d > to %d", ErrTreeSize, from, to)
	}
	nodes, err := proof.Consistency(from, to)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTreeSize, err)
	}
	return l.fetchProof(ctx, nodes)
}

// RootAt returns the root hash of the tree of the first size entries,
// from the stored nodes.
func (l *Log) RootAt(ctx context.Context, size uint64) ([32]byte, error) {
	var out [32]byte
	if err := l.checkSize(size); err != nil {
		return out, err
	}
	if err := ctx.Err(); err != nil {
		return out, err
	}
	ids := compact.RangeNodes(0, size, nil)
	hashes := make([][]byte, len(ids))
	err := l.view(func(tx *bolt.Tx) error {
		return getNodes(tx, ids, hashes)
	})
	if err != nil {
		return out, err
	}
	rng, err := rangeFactory.NewRange(0, size, hashes)
	if err != nil {
		return out, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return rootOf(rng), nil
}

// LeafHashAt returns the stored leaf hash of the entry at index.
func (l *Log) LeafHashAt(index uint64) ([32]byte, error) {
	var out [32]byte
	if err := l.checkSize(index + 1); err != nil {
		return out, err
	}
	err := l.view(func(tx *bolt.Tx) error {
		h := make([][]byte, 1)
		if err := getNodes(tx, []compact.NodeID{compact.NewNodeID(0, index)}, h); err != nil {
			return err
		}
		copy(out[:], h[0])
		return nil
	})
	return out, err
}

func (l *Log) checkSize(size uint64) error {
	if cur := l.Size(); size > cur {
		return fmt.Errorf("%w: tree size %d > %d", ErrTreeSize, size, cur)
	}
	return nil
}

func (l *Log) fetchProof(ctx context.Context, nodes proof.Nodes) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	hashes := make([][]byte, len(nodes.IDs))
	if err := l.view(func(tx *bolt.Tx) error { return getNodes(tx, nodes.IDs, hashes) }); err != nil {
		return nil, err
	}
	return nodes.Rehash(hashes, hasher.HashChildren)
}

func getNodes(tx *bolt.Tx, ids []compact.NodeID, out [][]byte) error {
	nr := newNodeReader(tx)
	for i, id := range ids {
		h, err := nr.node(id.Level, id.Index)
		if err != nil {
			return err
		}
		out[i] = append([]byte(nil), h...)
	}
	return nil
}
