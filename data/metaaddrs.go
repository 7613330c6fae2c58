package data

import (
	"strings"

	"google.golang.org/grpc/resolver"
)

// metaScheme is the gRPC target scheme of a list of meta servers:
// "weft-meta:///host1:port,host2:port". The connection takes the first
// that answers (pick_first) and moves to another when it goes away, so a
// data server registers and heartbeats with whichever meta server is up;
// followers forward to the elected cluster manager.
const metaScheme = "weft-meta"

func init() { resolver.Register(metaResolver{}) }

// MetaTarget returns the gRPC target for a meta address or a list of
// them separated by commas.
func MetaTarget(addrs string) string {
	if !strings.Contains(addrs, ",") {
		return addrs
	}
	return metaScheme + ":///" + addrs
}

// metaResolver resolves a weft-meta target into its addresses.
type metaResolver struct{}

func (metaResolver) Scheme() string { return metaScheme }

func (metaResolver) Build(t resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	var st resolver.State
	for _, a := range strings.Split(t.Endpoint(), ",") {
		if a = strings.TrimSpace(a); a != "" {
			st.Endpoints = append(st.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
		}
	}
	if err := cc.UpdateState(st); err != nil {
		return nil, err
	}
	return metaResolver{}, nil
}

func (metaResolver) ResolveNow(resolver.ResolveNowOptions) {}

func (metaResolver) Close() {}
