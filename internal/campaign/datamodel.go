package campaign

import (
	"bytes"
	"fmt"
	"slices"
	"time"
)

// dataModel is what a data workload knows of one of its files: what was
// acknowledged (by a successful fsync or close), what it wrote since,
// and whether an error since leaves the file's state open.
//
// Once an operation on the file failed, the file may hold any mix of its
// acknowledged content and the writes since: each byte its acknowledged
// value, the value of a write since that covers it, or zero past a
// truncation; its length anything between the shortest and the longest
// it had since the acknowledgement. explain checks what the file holds
// against that.
type dataModel struct {
	exists bool   // its creation was acknowledged
	acked  []byte // content at the last acknowledgement
	cur    []byte // content as this client wrote it
	edits  []edit // since the last acknowledgement
	failed bool   // an operation failed since the last acknowledgement
	// late are the writes of a failed state that was settled (adopt):
	// sent before a failure (a mount killed, a chain stalled), they may
	// still be in a chain and land after the file was read back, until
	// lateUntil.
	late      []edit
	lateUntil time.Time
	adopted   []byte // the content settled then
}

// maxLate bounds the late writes a model keeps.
const maxLate = 64

// edit is a write (data at off) or a truncation (to size).
type edit struct {
	off   int64
	data  []byte
	trunc bool
	size  int64
}

// write applies a successful write to cur.
func (m *dataModel) write(off int64, data []byte) {
	if end := off + int64(len(data)); end > int64(len(m.cur)) {
		m.cur = append(m.cur, make([]byte, end-int64(len(m.cur)))...)
	}
	copy(m.cur[off:], data)
	m.edits = append(m.edits, edit{off: off, data: slices.Clone(data)})
}

// truncate applies a successful truncation to cur.
func (m *dataModel) truncate(size int64) {
	if size <= int64(len(m.cur)) {
		m.cur = m.cur[:size]
	} else {
		m.cur = append(m.cur, make([]byte, size-int64(len(m.cur)))...)
	}
	m.edits = append(m.edits, edit{trunc: true, size: size})
}

// noteWriteAttempt records a write that failed: it may have reached the
// file all the same.
func (m *dataModel) noteWriteAttempt(off int64, data []byte) {
	m.edits = append(m.edits, edit{off: off, data: slices.Clone(data)})
}

// noteTruncateAttempt records a truncation that failed.
func (m *dataModel) noteTruncateAttempt(size int64) {
	m.edits = append(m.edits, edit{trunc: true, size: size})
}

// ack makes cur the acknowledged content.
func (m *dataModel) ack() {
	m.exists = true
	m.acked = slices.Clone(m.cur)
	m.edits = nil
	m.failed = false
}

// adopt makes got, what the file was found to hold (and then synced),
// both the acknowledged and the current content. The writes since the
// last acknowledgement may still land until lateUntil.
func (m *dataModel) adopt(got []byte, lateUntil time.Time) {
	for _, e := range m.edits {
		if !e.trunc {
			m.late = append(m.late, e)
		}
	}
	if len(m.late) > maxLate {
		m.late = m.late[len(m.late)-maxLate:]
	}
	m.lateUntil = lateUntil
	m.cur = slices.Clone(got)
	m.adopted = slices.Clone(got)
	m.ack()
}

// lateWrite reports whether byte i reading b is a late write landing.
func (m *dataModel) lateWrite(i int64, b byte) bool {
	if time.Now().After(m.lateUntil) {
		return false
	}
	for _, e := range m.late {
		if i >= e.off && i < e.off+int64(len(e.data)) && e.data[i-e.off] == b {
			return true
		}
	}
	return false
}

// lateExplains reports whether every byte where got (read at off) and
// want differ is a late write landing (and they differ somewhere), and
// whether such a write replaced a byte this client wrote since the
// settling and had acknowledged (a write of the failed client clobbering
// acknowledged data of a live one).
func (m *dataModel) lateExplains(off int64, got, want []byte) (explained, clobbered bool) {
	if len(got) != len(want) || string(got) == string(want) {
		return false, false
	}
	for i := range got {
		if got[i] == want[i] {
			continue
		}
		j := off + int64(i)
		if !m.lateWrite(j, got[i]) {
			return false, false
		}
		rewritten := j >= int64(len(m.adopted)) || m.adopted[j] != want[i]
		if rewritten && j < int64(len(m.acked)) && m.acked[j] == want[i] {
			clobbered = true
		}
	}
	return true, clobbered
}

// forget resets the model to a file that does not exist.
func (m *dataModel) forget() {
	*m = dataModel{}
}

// lengths returns the shortest and longest length the file may have.
func (m *dataModel) lengths() (lo, hi int64) {
	l := int64(0)
	if m.exists {
		l = int64(len(m.acked))
	}
	lo, hi = l, l
	for _, e := range m.edits {
		if e.trunc {
			l = e.size
		} else {
			l = max(l, e.off+int64(len(e.data)))
		}
		lo, hi = min(lo, l), max(hi, l)
	}
	return lo, hi
}

// explain checks got, the file's content, against the model. Without a
// failure since the acknowledgement it must be cur exactly; with one,
// every byte and the length must be one the model allows. It returns ""
// or what is wrong.
func (m *dataModel) explain(got []byte) string {
	if !m.failed {
		if bytes.Equal(got, m.cur) {
			return ""
		}
		return describeDiff(got, m.cur)
	}
	lo, hi := m.lengths()
	if n := int64(len(got)); n < lo || n > hi {
		return fmt.Sprintf("length %d, but the file may only be %d to %d bytes long (acknowledged %d, %d changes since)",
			n, lo, hi, len(m.acked), len(m.edits))
	}
	zeroFrom := int64(-1) // bytes at or past it may read zero
	if !m.exists {
		zeroFrom = 0
	} else {
		zeroFrom = int64(len(m.acked))
	}
	for _, e := range m.edits {
		if e.trunc {
			zeroFrom = min(zeroFrom, e.size)
		}
	}
	for i, b := range got {
		i := int64(i)
		base := byte(0)
		if m.exists && i < int64(len(m.acked)) {
			base = m.acked[i]
		}
		if b == base || (b == 0 && i >= zeroFrom) {
			continue
		}
		ok := false
		for _, e := range m.edits {
			if !e.trunc && i >= e.off && i < e.off+int64(len(e.data)) && e.data[i-e.off] == b {
				ok = true
				break
			}
		}
		if !ok && !m.lateWrite(i, b) {
			return fmt.Sprintf("byte %d is %#02x: neither the acknowledged %#02x nor a value written since (%d changes since the acknowledgement of %d bytes)",
				i, b, base, len(m.edits), len(m.acked))
		}
	}
	return ""
}

// describeDiff says where got differs from want.
func describeDiff(got, want []byte) string {
	n := min(len(got), len(want))
	for i := range n {
		if got[i] != want[i] {
			j := i
			for j < n && got[j] != want[j] {
				j++
			}
			zeros := bytes.Count(got[i:j], []byte{0}) == j-i
			s := fmt.Sprintf("%d bytes, want %d: bytes %d..%d differ", len(got), len(want), i, j)
			if zeros {
				s += " (read as zeros)"
			}
			return s
		}
	}
	return fmt.Sprintf("%d bytes, want %d (the same up to the shorter)", len(got), len(want))
}
