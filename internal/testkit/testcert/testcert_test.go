package testcert

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestIssuedLeavesVerify: a leaf verifies against its CA's pool for its own usage and
// names, not for the other usage nor against another CA, and its written files load.
func TestIssuedLeavesVerify(t *testing.T) {
	ca, other := NewCA(t, "ca"), NewCA(t, "other")
	srv := ca.Issue(Leaf{Server: true, IPs: []net.IP{net.ParseIP("127.0.0.1")}, DNS: []string{"xds.test"}})
	cli := ca.Issue(Leaf{URIs: []string{"spiffe://fleet.example/edge-7"}})
	verify := func(c tls.Certificate, pool *x509.CertPool, name string, usage x509.ExtKeyUsage) error {
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: name, KeyUsages: []x509.ExtKeyUsage{usage}})
		return err
	}
	if err := verify(srv, ca.Pool, "xds.test", x509.ExtKeyUsageServerAuth); err != nil {
		t.Errorf("server leaf: %v", err)
	}
	if err := verify(cli, ca.Pool, "", x509.ExtKeyUsageClientAuth); err != nil {
		t.Errorf("client leaf: %v", err)
	}
	if verify(cli, ca.Pool, "", x509.ExtKeyUsageServerAuth) == nil {
		t.Error("a client leaf verified as a server")
	}
	if verify(srv, other.Pool, "xds.test", x509.ExtKeyUsageServerAuth) == nil {
		t.Error("a leaf verified against another CA")
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "s.crt"), filepath.Join(dir, "s.key")
	ca.WriteLeaf(srv, certFile, keyFile)
	if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
		t.Errorf("written key pair: %v", err)
	}
	pem, err := os.ReadFile(ca.WriteCA(filepath.Join(dir, "ca.pem")))
	if err != nil {
		t.Fatal(err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(pem) {
		t.Error("the written CA file holds no certificate")
	}
}
