// Package certpool reads the CA files the commands and the ADS client trust: the roots a
// client verifies its server with, or the CAs a server verifies client certificates with.
package certpool

import (
	"crypto/x509"
	"fmt"
	"os"
)

// FromFile returns a pool of the PEM certificates in the file at path. A file that holds
// none is an error: a pool that trusts nothing would only fail later, at each handshake.
func FromFile(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err // the error names the path
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}
