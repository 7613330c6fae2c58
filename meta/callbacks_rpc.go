package meta

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// requestSession is the session a request comes from: its Caller's or
// its own session field (getattr, open, create).
func requestSession(req any) string {
	if r, ok := req.(interface{ GetCaller() *weftv1.Caller }); ok {
		if s := r.GetCaller().GetSession(); s != "" {
			return s
		}
	}
	if r, ok := req.(interface{ GetSession() string }); ok {
		return r.GetSession()
	}
	return ""
}

// asMessage is v as a message (nil if it is none).
func asMessage(v any) proto.Message {
	m, _ := v.(proto.Message)
	return m
}

// callbackInterceptor registers, for requests of a session, the session's
// interest in what the reply lets it cache, and marks the request's
// context with its session so that the changes it makes are not called
// back to it.
func (s *Service) callbackInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	sess := requestSession(req)
	if sess == "" {
		return handler(ctx, req)
	}
	if info.FullMethod == weftv1.Meta_CloseSession_FullMethodName {
		resp, err := handler(ctx, req)
		if err == nil {
			s.cb.endSession(sess)
		}
		return resp, err
	}
	// The inodes the reply lets the session cache (interest and
	// reply_interest in the method's call option): those known before
	// the call are registered before it reads, so no change slips in
	// between.
	call := weftv1.MetaCallOf(info.FullMethod)
	s.cb.register(sess, 0, call.Interest(asMessage(req))...)
	mark := s.cb.mark()
	resp, err := handler(withOrigin(ctx, sess), req)
	if err == nil {
		s.cb.register(sess, mark, call.ReplyInterest(asMessage(resp))...)
	}
	return resp, err
}

// Watch streams the callbacks of a session: Invalidation messages naming
// the inodes and entries it cached that changed, batched (what piles up
// while one is sent goes in the next). The first message is always
// Invalidation.all (what was cached before the stream may have changed
// unseen); a client that falls too far behind gets Invalidation.all
// instead of a growing queue. A new stream of the same session replaces
// the older one, which ends.
func (s *Service) Watch(req *weftv1.WatchRequest, stream grpc.ServerStreamingServer[weftv1.Invalidation]) error {
	if req.Session == "" {
		return status.Error(codes.InvalidArgument, "watch: no session given")
	}
	cs, gen := s.cb.attach(req.Session)
	defer s.cb.detach(cs, gen)
	ctx := stream.Context()
	for {
		select {
		case <-cs.wake:
		case <-ctx.Done():
			return nil
		case <-s.cb.done:
			return status.Error(codes.Unavailable, "meta service stopping")
		}
		inv, ok := s.cb.take(cs, gen)
		if !ok {
			return status.Error(codes.Aborted, "watch: replaced by a newer stream of the session")
		}
		if inv == nil {
			continue
		}
		if err := stream.Send(inv); err != nil {
			return err
		}
		s.cb.sent.Add(1)
	}
}

// Forget drops a session's interest in inodes its client no longer caches.
func (s *Service) Forget(_ context.Context, req *weftv1.ForgetRequest) (*weftv1.ForgetResponse, error) {
	s.cb.forget(req.Session, req.Inodes)
	return &weftv1.ForgetResponse{}, nil
}

// CallbackStats reports the callback state: sessions known, (session,
// inode) interests held, changes published, Invalidation messages sent
// and how many of them were Invalidation.all.
func (s *Service) CallbackStats() (sessions, interests int, published, sent, alls uint64) {
	sessions, interests = s.cb.stats()
	return sessions, interests, s.cb.published.Load(), s.cb.sent.Load(), s.cb.alls.Load()
}
