package meta

import "testing"

// FuzzRecordDecoders feeds the decoders of the meta service's own
// records (directory entries, counter shards, sessions, locks) whatever a
// damaged engine may hold: each answers a value or an error, never
// panics. The other records are protobuf messages.
func FuzzRecordDecoders(f *testing.F) {
	f.Add([]byte("n/lk/\x00\x00\x00\x00\x00\x00\x00\x01/1/sess/\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00"), make([]byte, lockValueLen))
	f.Add([]byte("n/cnt/files/1"), make([]byte, 16))
	f.Add([]byte("s1"), []byte(`{"host":"h","mount_point":"/m"}`))
	f.Add([]byte{}, make([]byte, 12))
	f.Fuzz(func(t *testing.T, k, v []byte) {
		decodeDentry(v)
		decodeShard(k, v)
		decodeSession(string(k), v)
		key := append(append([]byte(nil), prefixLock...), k...)
		if l, err := decodeLock(prefixLock, key, v); err == nil && l.end < l.start {
			t.Fatalf("lock %+v ends before it starts", l)
		}
	})
}
