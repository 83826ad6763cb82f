// Package testcert issues real X.509 certificates for tests: a CA, the leaves it signs, and
// their PEM files. Keys are ECDSA P-256; every certificate is valid from an hour ago to an
// hour from now.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority of one test. Its methods fail that test on any error.
type CA struct {
	tb testing.TB
	// Cert is the CA's own certificate.
	Cert *x509.Certificate
	// Key signs the leaves.
	Key *ecdsa.PrivateKey
	// Pool holds Cert alone: the roots (or client CAs) of whoever trusts this CA.
	Pool   *x509.CertPool
	der    []byte
	serial atomic.Int64
}

// NewCA makes a self-signed CA named name.
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("testcert: generating the CA key: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("testcert: signing the CA: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("testcert: parsing the CA: %v", err)
	}
	ca := &CA{tb: tb, Cert: cert, Key: key, Pool: x509.NewCertPool(), der: der}
	ca.Pool.AddCert(cert)
	ca.serial.Store(1)
	return ca
}

// Leaf says what a certificate the CA issues is for and whom it names.
type Leaf struct {
	// Name is the subject's common name ("node" when empty).
	Name string
	// Server makes a server certificate (extended key usage server auth); otherwise the
	// certificate is a client one.
	Server bool
	// IPs, DNS and URIs are the subject alternative names.
	IPs  []net.IP
	DNS  []string
	URIs []string
}

// Issue signs a new key for l.
func (ca *CA) Issue(l Leaf) tls.Certificate {
	ca.tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		ca.tb.Fatalf("testcert: generating a leaf key: %v", err)
	}
	name, usage := l.Name, x509.ExtKeyUsageClientAuth
	if name == "" {
		name = "node"
	}
	if l.Server {
		usage = x509.ExtKeyUsageServerAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: l.IPs, DNSNames: l.DNS,
	}
	for _, u := range l.URIs {
		pu, err := url.Parse(u)
		if err != nil {
			ca.tb.Fatalf("testcert: URI SAN %q: %v", u, err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		ca.tb.Fatalf("testcert: signing a leaf: %v", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// WriteCA writes the CA's certificate as PEM to path and returns path.
func (ca *CA) WriteCA(path string) string {
	ca.tb.Helper()
	writePEM(ca.tb, path, "CERTIFICATE", ca.der)
	return path
}

// WriteLeaf writes c, as Issue returned it, to a certificate file and a key file (PEM),
// as a server or a client loads them.
func (ca *CA) WriteLeaf(c tls.Certificate, certFile, keyFile string) {
	ca.tb.Helper()
	key, ok := c.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		ca.tb.Fatalf("testcert: the key is a %T, not one Issue made", c.PrivateKey)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		ca.tb.Fatalf("testcert: encoding the key: %v", err)
	}
	writePEM(ca.tb, certFile, "CERTIFICATE", c.Certificate[0])
	writePEM(ca.tb, keyFile, "EC PRIVATE KEY", kder)
}

func writePEM(tb testing.TB, path, kind string, der []byte) {
	tb.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		tb.Fatalf("testcert: %v", err)
	}
}
