package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/stickylb/stickylb/internal/certpool"
	"github.com/stickylb/stickylb/internal/secretfile"
	"github.com/stickylb/stickylb/xds/store"
)

const ctlUsage = `usage: stickylb ctl --api URL (--token-file F | --cert F --key F) [--ca F] [--timeout D] VERB ...

The change API of a control-plane replica (stickylb xds --etcd ... --api ADDR). Every
change is validated by the pools file's rules, stored with a compare-and-swap, and pushed
to every node. A BACKEND is named by its hash_key when it has one, else by its address.

verbs:
  services                          every service with its backends, verdicts and drains
  service SERVICE                   one service
  drain SERVICE BACKEND             no new sessions to the backend (drain: true)
  undrain SERVICE BACKEND           new sessions again
  weight SERVICE BACKEND N          set the backend's weight (1..10000); a backend the service
                                    lacks is an error (404), never added
  add SERVICE BACKEND-JSON          add a backend, e.g. '{"address": "10.0.1.4:8080", "zone": "zone-a"}';
                                    one the service has already is an error (409)
  remove SERVICE BACKEND            remove the backend from the service
  zone-drain SERVICE ZONE           list the zone in drained_zones (its backends are the last resort)
  zone-undrain SERVICE ZONE         take the zone out of drained_zones
  pools-get                         print the stored pools file (its revision on stderr)
  pools-put FILE [--if-match N | --force]
                                    replace the pools file: if it is still at revision N, or
                                    (without --if-match) at the revision read just before,
                                    refusing when someone else stored it last unless --force
`

// ctlClient is the API's HTTP client.
type ctlClient struct {
	base  string
	token string
	hc    *http.Client
}

func ctlCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("ctl", ctlUsage, stderr)
	apiURL := fs.String("api", "", "the API's URL (https://HOST:PORT, or http:// on loopback)")
	tokenFile := fs.String("token-file", "", "file holding the bearer token alone")
	cert := fs.String("cert", "", "client certificate (PEM)")
	key := fs.String("key", "", "client key (PEM)")
	ca := fs.String("ca", "", "CA bundle (PEM) that signs the API's certificate")
	ifMatch := fs.Int64("if-match", -1, "pools-put: the revision the file was read at")
	force := fs.Bool("force", false, "pools-put: replace the file even when someone else stored it last")
	timeout := fs.Duration("timeout", 15*time.Second, "how long to wait for the API")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return parseError(err)
	}
	if *apiURL == "" || len(pos) == 0 || (*tokenFile == "") == (*cert == "") || (*cert == "") != (*key == "") {
		fmt.Fprint(stderr, ctlUsage)
		return 2
	}
	c := &ctlClient{base: strings.TrimRight(*apiURL, "/")}
	tcfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if *ca != "" {
		if tcfg.RootCAs, err = certpool.FromFile(*ca); err != nil {
			fmt.Fprintf(stderr, "stickylb ctl: %v\n", err)
			return 1
		}
	}
	if *cert != "" {
		kp, err := tls.LoadX509KeyPair(*cert, *key)
		if err != nil {
			fmt.Fprintf(stderr, "stickylb ctl: %v\n", err)
			return 1
		}
		tcfg.Certificates = []tls.Certificate{kp}
	}
	if *tokenFile != "" {
		b, err := secretfile.Read(*tokenFile)
		if err != nil {
			fmt.Fprintf(stderr, "stickylb ctl: %v\n", err)
			return 1
		}
		c.token = strings.TrimSpace(string(b))
	}
	c.hc = &http.Client{Timeout: *timeout, Transport: &http.Transport{TLSClientConfig: tcfg}}
	req, err := c.request(pos, *ifMatch, *force)
	if err != nil {
		fmt.Fprintf(stderr, "stickylb ctl: %v\n", err)
		if errors.Is(err, errCtlUsage) {
			fmt.Fprint(stderr, ctlUsage)
			return 2
		}
		return 1
	}
	return c.do(req, pos[0] == "pools-get", stdout, stderr)
}

var errCtlUsage = errors.New("wrong arguments")

// request builds the API request of a verb.
func (c *ctlClient) request(pos []string, ifMatch int64, force bool) (*http.Request, error) {
	verb, args := pos[0], pos[1:]
	want := map[string]int{"services": 0, "service": 1, "drain": 2, "undrain": 2, "weight": 3, "add": 2, "remove": 2,
		"zone-drain": 2, "zone-undrain": 2, "pools-get": 0, "pools-put": 1}
	n, ok := want[verb]
	if !ok {
		return nil, fmt.Errorf("%w: unknown verb %q", errCtlUsage, verb)
	}
	if len(args) != n {
		return nil, fmt.Errorf("%w: %s takes %d arguments", errCtlUsage, verb, n)
	}
	backendPath := func(svc, b string) string {
		return "/v1/services/" + url.PathEscape(svc) + "/backends/" + url.PathEscape(b)
	}
	switch verb {
	case "services":
		return c.newRequest(http.MethodGet, "/v1/services", nil)
	case "service":
		return c.newRequest(http.MethodGet, "/v1/services/"+url.PathEscape(args[0]), nil)
	case "drain", "undrain":
		return c.newRequest(http.MethodPost, backendPath(args[0], args[1])+"/"+verb, nil)
	case "weight":
		w, err := strconv.Atoi(args[2])
		if err != nil {
			return nil, fmt.Errorf("weight %q: want a whole number", args[2])
		}
		return c.newRequest(http.MethodPut, backendPath(args[0], args[1]), fmt.Appendf(nil, `{"weight": %d}`, w))
	case "add":
		return c.newRequest(http.MethodPost, "/v1/services/"+url.PathEscape(args[0])+"/backends", []byte(args[1]))
	case "remove":
		return c.newRequest(http.MethodDelete, backendPath(args[0], args[1]), nil)
	case "zone-drain", "zone-undrain":
		return c.newRequest(http.MethodPost, "/v1/services/"+url.PathEscape(args[0])+"/zones/"+url.PathEscape(args[1])+"/"+strings.TrimPrefix(verb, "zone-"), nil)
	case "pools-get":
		return c.newRequest(http.MethodGet, "/v1/pools", nil)
	}
	body, err := os.ReadFile(args[0]) // pools-put
	if err != nil {
		return nil, err
	}
	req, err := c.newRequest(http.MethodPut, "/v1/pools", body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/yaml")
	if ifMatch < 0 {
		stored, err := c.stored()
		if err != nil {
			return nil, err
		}
		if !force {
			if err := overwriteCheck(stored.doc(), stored.Caller, "stickylb ctl ... pools-get", "--if-match", "pools-put"); err != nil {
				return nil, err
			}
		}
		ifMatch = stored.Revision
	}
	req.Header.Set("If-Match", `"`+strconv.FormatInt(ifMatch, 10)+`"`)
	return req, nil
}

func (c *ctlClient) newRequest(method, path string, body []byte) (*http.Request, error) {
	req, err := http.NewRequest(method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// storedFile is what GET /v1/pools says of the stored file.
type storedFile struct {
	Revision int64     `json:"revision"`
	File     string    `json:"file"`
	By       string    `json:"stored_by"`
	At       time.Time `json:"stored_at"`
	Op       string    `json:"op"`
	// Caller is the name this client authenticated as.
	Caller string `json:"caller"`
	Error  string `json:"error"`
}

// doc is the stored file as a document (nil when none is stored).
func (f *storedFile) doc() *store.Document {
	if f.Revision == 0 {
		return nil
	}
	return &store.Document{Revision: f.Revision, Change: store.Change{By: f.By, At: f.At, Op: f.Op}}
}

// stored reads the stored file (revision 0 when none is stored).
func (c *ctlClient) stored() (*storedFile, error) {
	req, err := c.newRequest(http.MethodGet, "/v1/pools", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out storedFile
	_ = json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&out)
	switch resp.StatusCode {
	case http.StatusOK:
		return &out, nil
	case http.StatusNotFound:
		return &storedFile{}, nil
	}
	return nil, fmt.Errorf("reading the stored revision: %s: %s", resp.Status, out.Error)
}

// do sends req and prints the answer: JSON as it comes, the pools file as a file.
func (c *ctlClient) do(req *http.Request, file bool, stdout, stderr io.Writer) int {
	resp, err := c.hc.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "stickylb ctl: %v\n", err)
		return 1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		fmt.Fprintf(stderr, "stickylb ctl: reading the answer: %v\n", err)
		return 1
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error    string   `json:"error"`
			Errors   []string `json:"errors"`
			Revision int64    `json:"revision"`
		}
		if json.Unmarshal(body, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(body))
		}
		fmt.Fprintf(stderr, "stickylb ctl: %s: %s\n", resp.Status, e.Error)
		for _, m := range e.Errors {
			fmt.Fprintf(stderr, "  %s\n", m)
		}
		return 1
	}
	if file {
		var p storedFile
		if err := json.Unmarshal(body, &p); err != nil {
			fmt.Fprintf(stderr, "stickylb ctl: %v\n", err)
			return 1
		}
		io.WriteString(stdout, p.File)
		fmt.Fprintf(stderr, "revision %d (stored by %s)\n", p.Revision, p.By)
		return 0
	}
	stdout.Write(body)
	return 0
}
