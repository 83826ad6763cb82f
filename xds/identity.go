package xds

import (
	"context"
	"crypto/x509"
	"net"
	"slices"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// peerIdentity is who is at the other end of a stream: the verified client certificate
// when there is one, else the peer's IP address (all a plaintext stream can be told by).
type peerIdentity struct {
	// name compares identities: "cert:" and the certificate's SANs, or "addr:" and the IP.
	name string
	// cert is the verified client certificate, nil without one.
	cert *x509.Certificate
}

// identityOf reads the identity of a stream's peer from its context.
func identityOf(ctx context.Context) peerIdentity {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return peerIdentity{}
	}
	if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
		c := ti.State.VerifiedChains[0][0]
		sans := slices.Clone(c.DNSNames)
		for _, u := range c.URIs {
			sans = append(sans, u.String())
		}
		slices.Sort(sans)
		return peerIdentity{name: "cert:" + strings.Join(sans, ","), cert: c}
	}
	if p.Addr == nil {
		return peerIdentity{}
	}
	host, _, err := net.SplitHostPort(p.Addr.String())
	if err != nil {
		host = p.Addr.String()
	}
	return peerIdentity{name: "addr:" + host}
}

// covers reports whether the certificate may speak for node id: a URI SAN
// spiffe://TRUST_DOMAIN/ID (any trust domain the CA signs for), or a DNS SAN equal to the
// id's host part, what comes before its first "/" (so one certificate for HOST covers
// HOST/xdp/eth0 and HOST/caddy). DNS names compare without case; a wildcard DNS SAN covers
// nothing (it would let one certificate speak for a whole fleet).
func (p peerIdentity) covers(id string) bool {
	if p.cert == nil || id == "" {
		return false
	}
	for _, u := range p.cert.URIs {
		if u.Scheme == "spiffe" && u.Host != "" && u.Path == "/"+id && u.RawQuery == "" && u.Fragment == "" {
			return true
		}
	}
	host, _, _ := strings.Cut(id, "/")
	for _, d := range p.cert.DNSNames {
		if !strings.Contains(d, "*") && strings.EqualFold(d, host) {
			return true
		}
	}
	return false
}

// describe names the certificate's SANs for an error message.
func (p peerIdentity) describe() string {
	if p.cert == nil {
		return "no client certificate"
	}
	return "a certificate with SANs [" + strings.TrimPrefix(p.name, "cert:") + "]"
}
