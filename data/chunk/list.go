package chunk

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
)

// CompareListOrder orders chunks as List returns them: by ino%256 (the
// directory they hash to), then ino, then index.
func CompareListOrder(a, b ID) int {
	return cmp.Or(cmp.Compare(a.Ino%256, b.Ino%256), cmp.Compare(a.Ino, b.Ino), cmp.Compare(a.Index, b.Index))
}

// List returns up to limit chunks written through chain, in list order
// (CompareListOrder) after `after` (from the start if nil), with their
// versions, lengths and digests; more reports that chunks may follow.
// Chunks created and never committed belong to no chain and are not
// listed. Each call reads the headers of the chunks it passes over.
func (t *Target) List(chain uint64, after *ID, limit int) (infos []Info, more bool, err error) {
	err = t.walk(after, func(id ID) (bool, error) {
		info, err := t.Stat(id)
		if err != nil {
			var ce *CorruptionError
			if errors.As(err, &ce) { // unknown chain: repaired by scrub or a read
				return true, nil
			}
			return false, err
		}
		if !info.Exists || info.Chain == 0 || info.Chain != chain {
			return true, nil
		}
		if len(infos) == limit {
			more = true
			return false, nil
		}
		infos = append(infos, info)
		return true, nil
	})
	return infos, more, err
}

// Chunks returns up to limit chunks of the target (of any chain) in list
// order after `after`; more reports that chunks may follow.
func (t *Target) Chunks(after *ID, limit int) (ids []ID, more bool, err error) {
	err = t.walk(after, func(id ID) (bool, error) {
		if len(ids) == limit {
			more = true
			return false, nil
		}
		ids = append(ids, id)
		return true, nil
	})
	return ids, more, err
}

// walk calls fn for every chunk file after `after` in list order until fn
// returns false.
func (t *Target) walk(after *ID, fn func(ID) (bool, error)) error {
	startBucket := uint64(0)
	if after != nil {
		startBucket = after.Ino % 256
	}
	for bucket := startBucket; bucket < 256; bucket++ {
		dir := filepath.Join(t.dir, "chunks", fmt.Sprintf("%02x", bucket))
		entries, err := t.fs.ReadDir(dir)
		if err != nil {
			return t.ioError("list chunks", err)
		}
		var inos []uint64
		for _, e := range entries {
			if ino, err := strconv.ParseUint(e.Name(), 16, 64); err == nil {
				inos = append(inos, ino)
			}
		}
		slices.Sort(inos)
		for _, ino := range inos {
			if after != nil && bucket == startBucket && ino < after.Ino {
				continue
			}
			ids, err := t.fileChunks(ino)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			slices.SortFunc(ids, CompareListOrder)
			for _, id := range ids {
				if after != nil && CompareListOrder(id, *after) <= 0 {
					continue
				}
				if goOn, err := fn(id); err != nil || !goOn {
					return err
				}
			}
		}
	}
	return nil
}
