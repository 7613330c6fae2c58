package meta

import (
	"encoding/json"

	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// maxSessionsListed bounds the sessions Status lists one by one (all are
// counted).
const maxSessionsListed = 1000

// sessionList describes the client sessions for Status: host, mount point,
// version, open files, lock records and the time left on the lease
// (negative once expired and not yet cleaned up). Sessions being closed
// are listed too.
func (x *tx) sessionList() ([]*weftv1.SessionStatus, error) {
	var list []*weftv1.SessionStatus
	err := x.t.Scan(prefixSession, kv.PrefixEnd(prefixSession), func(k, v []byte) (bool, error) {
		st := &weftv1.SessionStatus{Id: string(k[len(prefixSession):])}
		rec := new(sessionRecord)
		if json.Unmarshal(v, rec) == nil {
			st.Host, st.MountPoint, st.Version = rec.Host, rec.MountPoint, rec.Version
			st.ExpiresInMs = (rec.ExpiresNs - x.now) / 1e6
		}
		list = append(list, st)
		return len(list) < maxSessionsListed, nil
	})
	if err != nil {
		return nil, err
	}
	for _, st := range list {
		opens, err := countPrefix(x.t, sessionOpensPrefix(st.Id))
		if err != nil {
			return nil, err
		}
		locks, err := x.sessionLockCount(st.Id)
		if err != nil {
			return nil, err
		}
		st.OpenFiles, st.Locks = uint32(min(opens, 1<<32-1)), uint32(min(locks, 1<<32-1))
	}
	return list, nil
}
