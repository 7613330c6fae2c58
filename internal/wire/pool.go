package wire

import (
	"math/bits"
	"sync"
)

// Buffers are pooled in power-of-two classes from 4 KiB to 128 MiB.
const (
	minClassShift = 12
	numClasses    = 16
)

var pools [numClasses]sync.Pool

func classOf(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassShift
}

// GetBuffer returns a buffer of n bytes from the pool (not zeroed). Give
// it back with PutBuffer once nothing references it any more.
func GetBuffer(n int) []byte {
	c := classOf(n)
	if c >= numClasses {
		return make([]byte, n)
	}
	if p, _ := pools[c].Get().(*[]byte); p != nil {
		return (*p)[:n]
	}
	return make([]byte, n, 1<<(c+minClassShift))
}

// PutBuffer returns a buffer obtained from GetBuffer to the pool.
func PutBuffer(b []byte) {
	c := classOf(cap(b))
	if c >= numClasses || cap(b) != 1<<(c+minClassShift) {
		return
	}
	b = b[:0]
	pools[c].Put(&b)
}
