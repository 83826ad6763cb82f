// Package adsclient is the xDS client of stickylb's own nodes (XDP forwarders, Caddy
// upstream sources): one state-of-the-world ADS stream to a control plane such as
// `stickylb xds`, with named subscriptions, ACK and NACK, reconnects and TLS.
//
// grpc-go's xDS client is internal to grpc-go, and go-control-plane's sotw client has
// neither named subscriptions nor reconnects, hence this one. It imports only grpc,
// protobuf, the Envoy API types, zap and the Prometheus client, never an adapter.
//
// # Use
//
//	c, err := adsclient.New(adsclient.Config{
//		Server: "xds.internal:18000", NodeID: "host-1/xdp/eth0", Zone: "zone-a",
//		UserAgentName: "stickylb-xdp", TLS: adsclient.TLS{CAFile: "ca.pem"},
//	}, log)
//	c.Subscribe(resource.ClusterType, applyClusters)          // every cluster
//	c.Subscribe(resource.EndpointType, applyEndpoints, "api") // one by name
//	c.Start(ctx)
//	defer c.Close()
//
// A Handler gets the decoded resources of its type by name, with their version, and returns
// an error to reject them. Decoding looks the type up in protobuf's registry, so the
// program must import the Go package of every type it subscribes to.
//
// # Protocol
//
// Every request restates the subscription's names and the nonce of the type's last
// response, as the state-of-the-world protocol wants; the first request of each type on a
// stream carries the node (id, cluster, user_agent_name and version, locality.zone).
// A wildcard subscription sends no names, as Envoy does for clusters and listeners:
// go-control-plane's caches take "*" for a resource name.
//
// A response is decoded, filtered to the subscribed names, and compared with what the
// handler last accepted. Equal content (a re-send, or a new version that changes nothing
// for this node) is ACKed without calling the handler. Otherwise the handler runs; on
// success the client ACKs with the response's version_info and nonce, on error it NACKs
// with the same nonce, the error text in error_detail, and version_info still the last
// ACKed version, so the control plane knows what the node runs. The handler must leave
// its last applied state in place on error. The same rejected content sent again on the
// stream is NACKed without calling the handler, and every NACK after the first since the
// type's last ACK is held back as long as a reconnect would wait (Backoff, without
// jitter): a control plane that answers a NACK by sending the rejected version again
// (go-control-plane's snapshot cache does, unless the control plane rolls the node back,
// as `stickylb xds` does) would otherwise loop at network speed.
//
// # Reconnects
//
// When the stream fails, the client waits a random time in [0, min(Max, Initial*2^n)]
// (full jitter, so a fleet that lost its control plane together does not come back in
// lockstep), then dials again; the ceiling returns to Initial after a stream that received a
// response. Each attempt dials a new gRPC connection, so this backoff is the only one (a
// long-lived connection would add grpc-go's own). A new stream restates every subscription
// with the version last ACKed, so a control plane that kept its state need not send it
// again; one that sends it anyway finds it ACKed as unchanged. Nothing is forgotten across
// reconnects: the handlers keep serving their last applied state while the control plane
// is away, which is how a node keeps forwarding through a control-plane outage. HTTP/2
// keepalive pings (Config.Keepalive) end a stream whose peer vanished without closing it.
//
// # Observability
//
// Connected reports whether a stream is up (opened over a ready transport: TLS done),
// LastUpdate when a response was last accepted, Version the last ACKed version of a type.
// Collector exports the same for Prometheus (stickylb_xds_connected, the time and age of
// the last update, stream ends, updates by type and result). Logs go to the zap logger
// given to New: stream up and down, applied updates (at most one line per type and
// ApplyLogEvery, the latest, with how many it stands for: see Sampled), each rejection with
// its reason.
//
// # TLS
//
// Config.TLS turns TLS on: CAFile verifies the server (the system roots when empty),
// CertFile and KeyFile add a client certificate (mTLS), ServerName overrides the name
// checked. The files are read again on every connection attempt, so rotated certificates
// apply at the next reconnect.
package adsclient
