package replica

import (
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Gate admits xDS streams while the replica serves, refuses new ones with UNAVAILABLE
// while it does not, and ends the open ones with UNAVAILABLE when it stops serving, so
// nodes move to a replica that has the store. go-control-plane ends a stream only on its
// own errors; the gate ends one by failing its next receive, after which the server's
// stream loop returns and the gate's status is what the node sees.
type Gate struct {
	mu     sync.Mutex
	open   bool
	reason string
	closed chan struct{} // closed when the gate closes; a new one when it opens
	// onChange, when set, is told every opening and closing (the gRPC health service).
	onChange func(open bool)
}

// OnChange has f told, under the gate's lock, whether the gate is open now and whenever
// that changes: the replica's gRPC health service reports SERVING only while it is, so an
// Envoy bootstrap health-checking its replicas sends its ADS stream elsewhere.
func (g *Gate) OnChange(f func(open bool)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.onChange = f
	f(g.open)
}

// NewGate returns a closed gate that refuses streams for reason.
func NewGate(reason string) *Gate {
	c := make(chan struct{})
	close(c)
	return &Gate{reason: reason, closed: c}
}

// Open admits streams.
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.open {
		g.open, g.reason, g.closed = true, "", make(chan struct{})
		if g.onChange != nil {
			g.onChange(true)
		}
	}
}

// Close refuses new streams and ends the open ones, each with UNAVAILABLE and reason.
func (g *Gate) Close(reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reason = reason
	if g.open {
		g.open = false
		close(g.closed)
		if g.onChange != nil {
			g.onChange(false)
		}
	}
}

// State reports whether the gate admits streams, and why not.
func (g *Gate) State() (open bool, reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open, g.reason
}

func (g *Gate) unavailable() error {
	_, reason := g.State()
	return status.Error(codes.Unavailable, "stickylb xds replica not serving: "+reason)
}

// gated reports whether a stream's method is xDS (ADS or a per-type discovery service of
// envoy.service.*), which the gate admits and ends; every other stream, the gRPC health
// service's Watch among them, passes.
func gated(fullMethod string) bool { return strings.HasPrefix(fullMethod, "/envoy.service.") }

// StreamInterceptor is the gate as a gRPC stream interceptor (install it on the server
// that serves xDS). It gates the xDS streams only.
func (g *Gate) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !gated(info.FullMethod) {
			return handler(srv, ss)
		}
		g.mu.Lock()
		open, closed := g.open, g.closed
		g.mu.Unlock()
		if !open {
			return g.unavailable()
		}
		err := handler(srv, &gatedStream{ServerStream: ss, closed: closed, g: g})
		select {
		case <-closed:
			return g.unavailable()
		default:
			return err
		}
	}
}

// gatedStream fails its receives once the gate closes.
type gatedStream struct {
	grpc.ServerStream
	closed <-chan struct{}
	g      *Gate
}

// RecvMsg waits for the next message or the gate's closing, whichever comes first. The
// receive left running when the gate closes ends with the stream, which ends as the
// handler returns: its caller has stopped reading by then.
func (s *gatedStream) RecvMsg(m any) error {
	select {
	case <-s.closed:
		return s.g.unavailable()
	default:
	}
	errc := make(chan error, 1)
	go func() { errc <- s.ServerStream.RecvMsg(m) }()
	select {
	case err := <-errc:
		return err
	case <-s.closed:
		return s.g.unavailable()
	}
}
