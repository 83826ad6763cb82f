package xds

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// ServerOptions are the gRPC server options the control plane serves with (credentials
// aside): keepalive as nodes use it, and streams whose node vanished without closing them
// found within a minute (until then their node id is taken: a reconnect from another
// address or certificate is refused, and their state is kept).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 20 * time.Second}),
	}
}
