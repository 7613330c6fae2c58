package meta

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/meta/kv"
)

// Retried namespace operations are applied at most once. A client that
// knows several meta servers sends every namespace operation that changes
// something with a request id (metadata weft-request-id, "<unix ns in 16
// hex digits>-<random>"). The transaction of the operation records the id
// under n/rq/<id>; a request whose id is already recorded (the client
// retried it on another meta server after the first was cut off in
// flight, and the first had committed) changes nothing and fails with
// codes.Aborted and the message errAlreadyApplied; the client then reads
// the result (a lookup of the new name, the inode's attributes). Records
// older than requestKeep are deleted by the manager.
const (
	mdRequestID      = "weft-request-id"
	requestKeep      = 2 * time.Minute
	requestSweepEach = 15 * time.Second
	requestSweepMax  = 100 // deletions per transaction
	// AlreadyAppliedMessage is the message of the codes.Aborted answer to
	// a request applied before.
	AlreadyAppliedMessage = "weft: request already applied"
)

var prefixRequest = []byte("n/rq/")

// requestToken carries a request id from the interceptor to the first
// update of the request.
type requestToken struct {
	id   string
	used atomic.Bool
}

type requestTokenKey struct{}

// withRequestToken adds the incoming request id, if any, to ctx.
func withRequestToken(ctx context.Context) context.Context {
	md, _ := metadata.FromIncomingContext(ctx)
	ids := md.Get(mdRequestID)
	if len(ids) == 0 || !validRequestID(ids[0]) {
		return ctx
	}
	return context.WithValue(ctx, requestTokenKey{}, &requestToken{id: ids[0]})
}

// validRequestID checks the form "<16 hex digits>-<1..64 more chars>".
func validRequestID(id string) bool {
	ts, rest, ok := strings.Cut(id, "-")
	if !ok || len(ts) != 16 || rest == "" || len(rest) > 64 || strings.Contains(rest, "/") {
		return false
	}
	_, err := strconv.ParseUint(ts, 16, 64)
	return err == nil
}

// takeRequestToken returns the request id of ctx for the request's first
// transaction; later transactions of the same request get "".
func takeRequestToken(ctx context.Context) string {
	tok, _ := ctx.Value(requestTokenKey{}).(*requestToken)
	if tok == nil || tok.used.Swap(true) {
		return ""
	}
	return tok.id
}

// errAlreadyApplied answers a request applied before.
var errAlreadyApplied = status.Error(codes.Aborted, AlreadyAppliedMessage)

// checkRequest, inside an update, fails with errAlreadyApplied if request
// id was applied before, and records it otherwise (the record commits
// with the operation, or not at all).
func checkRequest(t kv.Txn, id string) error {
	if id == "" {
		return nil
	}
	key := append(append([]byte{}, prefixRequest...), id...)
	_, ok, err := t.Get(key)
	if err != nil {
		return err
	}
	if ok {
		return errAlreadyApplied
	}
	return t.Set(key, binary.BigEndian.AppendUint64(nil, uint64(time.Now().UnixNano())))
}

// requestSweepLoop deletes request records older than requestKeep, on the
// manager only, until ctx is done.
func (s *Service) requestSweepLoop(ctx context.Context) {
	t := time.NewTicker(requestSweepEach)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !s.ha.managing() {
			continue
		}
		if err := s.sweepRequests(ctx, time.Now().Add(-requestKeep)); err != nil && ctx.Err() == nil {
			s.log.Warn("delete old request records (retrying later)", "err", err)
		}
	}
}

// sweepRequests deletes the request records made before cutoff.
func (s *Service) sweepRequests(ctx context.Context, cutoff time.Time) error {
	end := fmt.Appendf(append([]byte{}, prefixRequest...), "%016x", uint64(cutoff.UnixNano()))
	for {
		var keys [][]byte
		err := s.view(ctx, func(x *tx) error {
			return x.t.Scan(prefixRequest, end, func(k, _ []byte) (bool, error) {
				keys = append(keys, bytes.Clone(k))
				return len(keys) < requestSweepMax, nil
			})
		})
		if err != nil || len(keys) == 0 {
			return err
		}
		err = s.eng.Update(ctx, func(t kv.Txn) error {
			for _, k := range keys {
				if err := t.Delete(k); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil || len(keys) < requestSweepMax {
			return err
		}
	}
}
