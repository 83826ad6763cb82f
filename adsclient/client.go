package adsclient

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Handler applies one update of a subscription: the resources of its type the server sent
// (for a named subscription, only the subscribed names), keyed by resource name, and the
// version they came with. Returning an error rejects the update: the client NACKs it with
// the error's text, and the handler must leave the state it last applied in place.
//
// The client keeps the resources to recognise a re-send, so the handler must not modify
// them. Handlers run one at a time on the client's goroutine; they may call Subscribe,
// SetNames and Unsubscribe, but not Close (which waits for them).
type Handler func(version string, resources map[string]proto.Message) error

// Client is one ADS stream to one control plane, with its subscriptions. It is safe for
// concurrent use.
type Client struct {
	cfg  Config
	log  *zap.Logger
	node *corev3.Node

	// Test hooks: after is the clock of the reconnect waits, rand draws their jitter.
	after func(time.Duration) <-chan time.Time
	rand  func(n int64) int64

	wake chan struct{} // a subscription changed: the stream sends what changed

	mu         sync.Mutex
	subs       map[string]*subscription
	started    bool
	cancel     context.CancelFunc
	connected  bool
	server     string // the server of the current (or last) stream
	lastUpdate time.Time
	lastErr    error
	streamEnds uint64
	counts     map[updateKey]uint64
	// appliedLog writes the "applied" lines of each type, at most one per ApplyLogEvery.
	appliedLog map[string]*Sampled

	wg sync.WaitGroup
}

// subscription is the client's state for one type URL. Its fields are guarded by Client.mu,
// except the handler's (applied, hasApplied, rejected, rejectReason), which only the
// stream goroutine touches.
type subscription struct {
	typeURL string
	names   map[string]bool // nil: wildcard
	handler Handler

	acked      string                   // version last ACKed (sent again on reconnect)
	applied    map[string]proto.Message // what the handler last accepted
	hasApplied bool
	// rejected is what the handler last refused on this stream: the same content sent again
	// is NACKed without calling the handler.
	rejected     map[string]proto.Message
	rejectReason string
	// nacks counts this stream's NACKs of the type since its last ACK. A server that answers
	// a NACK by sending the same thing again (go-control-plane's cache does, unless the
	// control plane rolls the node back) would loop at network speed: every NACK after the
	// first waits as a reconnect would (Backoff, without jitter).
	nacks int
}

// updateKey labels the update counter.
type updateKey struct{ typeURL, result string }

// Results of a response, as counted.
const (
	resultApplied   = "applied"
	resultUnchanged = "unchanged"
	resultRejected  = "rejected"
)

// New returns a client for cfg; it connects once Start is called. log may be nil.
func New(cfg Config, log *zap.Logger) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Client{
		cfg:    cfg,
		log:    log.With(zap.String("xds_server", cfg.Server), zap.String("node", cfg.NodeID)),
		node:   cfg.node(),
		after:  time.After,
		rand:   rand.Int64N,
		wake:   make(chan struct{}, 1),
		subs:   map[string]*subscription{},
		counts: map[updateKey]uint64{},

		appliedLog: map[string]*Sampled{},
	}, nil
}

// Subscribe asks for resources of typeURL by name, or for all of them (a wildcard
// subscription) when no name is given, and has h apply them. One subscription per type.
func (c *Client) Subscribe(typeURL string, h Handler, names ...string) error {
	if typeURL == "" || h == nil {
		return errors.New("adsclient: subscribing needs a type URL and a handler")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.subs[typeURL]; ok {
		return fmt.Errorf("adsclient: already subscribed to %s", typeURL)
	}
	s := &subscription{typeURL: typeURL, handler: h}
	if len(names) > 0 {
		s.names = nameSet(names)
	}
	c.subs[typeURL] = s
	c.poke()
	return nil
}

// SetNames replaces the names of a named subscription (no names: none of them). A wildcard
// subscription cannot become named, nor the reverse: Unsubscribe and Subscribe again.
// Added names arrive when the server answers; resources whose names were removed stay
// applied until the next response of the type (a server need not answer a removal).
func (c *Client) SetNames(typeURL string, names ...string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.subs[typeURL]
	if !ok {
		return fmt.Errorf("adsclient: not subscribed to %s", typeURL)
	}
	if s.names == nil {
		return fmt.Errorf("adsclient: the subscription to %s is a wildcard", typeURL)
	}
	s.names = nameSet(names)
	c.poke()
	return nil
}

// Unsubscribe drops the subscription to typeURL; its handler is not called again.
func (c *Client) Unsubscribe(typeURL string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.subs, typeURL)
	c.poke()
}

// poke wakes the stream without blocking (one pending wake covers any number of changes).
func (c *Client) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func nameSet(names []string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// Start connects and keeps the stream up, reconnecting with backoff, until ctx ends or
// Close is called.
func (c *Client) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return errors.New("adsclient: started twice")
	}
	c.started = true
	ctx, c.cancel = context.WithCancel(ctx)
	c.wg.Add(1)
	go c.run(ctx)
	return nil
}

// Close stops the client and waits for its goroutines. The handlers' state stays as last
// applied.
func (c *Client) Close() error {
	c.mu.Lock()
	cancel := c.cancel
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.appliedLog {
		s.Stop()
	}
	return nil
}

// Connected reports whether a stream to the control plane is up.
func (c *Client) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.connected
}

// LastUpdate is when a response was last accepted (applied, or equal to what was applied);
// zero before the first.
func (c *Client) LastUpdate() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastUpdate
}

// Version is the version of typeURL last ACKed ("" before the first).
func (c *Client) Version(typeURL string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.subs[typeURL]; s != nil {
		return s.acked
	}
	return ""
}

// run is the client's goroutine: one stream after another, with backoff between them.
func (c *Client) run(ctx context.Context) {
	defer c.wg.Done()
	bo := backoff{cfg: c.cfg.Backoff, rand: c.rand}
	// attempts counts the streams since the last healthy one or the last wait: the client
	// waits only after a full round of the list has failed.
	next, attempts := 0, 0
	for {
		server := c.cfg.Servers[next]
		healthy, err := c.stream(ctx, server)
		c.mu.Lock()
		c.connected = false
		c.streamEnds++
		c.lastErr = err
		c.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if healthy {
			bo.reset()
			attempts = 0
		}
		attempts++
		next = (next + 1) % len(c.cfg.Servers)
		if attempts%len(c.cfg.Servers) != 0 {
			c.log.Warn("xDS stream ended; trying the next server", zap.String("server", server), zap.Error(err),
				zap.String("next", c.cfg.Servers[next]))
			continue
		}
		wait := bo.next()
		c.log.Warn("xDS stream ended; reconnecting", zap.String("server", server), zap.Error(err), zap.Duration("after", wait))
		select {
		case <-ctx.Done():
			return
		case <-c.after(wait):
		}
	}
}

// adsStream is the client side of an ADS stream.
type adsStream = discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient

// typeStream is what one stream has told the server about one type.
type typeStream struct {
	sub   *subscription // the subscription the requests were for
	sent  bool          // a request went out (and carried the node)
	names []string      // the names last sent (nil: wildcard)
	nonce string        // the nonce of the last response
}

// stream runs one ADS stream until it fails or ctx ends; healthy reports whether it
// received a response (which resets the backoff).
func (c *Client) stream(ctx context.Context, server string) (healthy bool, err error) {
	opts, err := c.cfg.dialOptions()
	if err != nil {
		return false, err
	}
	conn, err := grpc.NewClient(server, opts...)
	if err != nil {
		return false, fmt.Errorf("dialing %s: %w", server, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	var recvWG sync.WaitGroup
	defer recvWG.Wait() // after cancel (defers run last first), which ends Recv
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, fmt.Errorf("opening the ADS stream: %w", err)
	}
	// With fail-fast RPCs the stream opens only over a ready transport (TLS done), so the
	// node counts as connected from here.
	c.mu.Lock()
	c.connected, c.server = true, server
	for _, s := range c.subs {
		s.rejected, s.nacks = nil, 0 // a new stream gives a rejected update one more try
	}
	c.mu.Unlock()
	c.log.Info("xDS stream up", zap.String("server", server))
	resps, recvErr := receive(ctx, st, &recvWG)
	return c.exchange(ctx, st, resps, recvErr)
}

// receive runs st's Recv on a goroutine of wg until it fails (the error on the second
// channel) or ctx ends, handing over each response.
func receive(ctx context.Context, st adsStream, wg *sync.WaitGroup) (<-chan *discoveryv3.DiscoveryResponse, <-chan error) {
	resps := make(chan *discoveryv3.DiscoveryResponse)
	recvErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			r, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case resps <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	return resps, recvErr
}

// exchange asks for the subscriptions on st, applies the responses and answers each with
// its ACK or NACK (a repeated NACK held for its delay), until the stream fails or ctx
// ends; healthy reports whether a response came.
func (c *Client) exchange(ctx context.Context, st adsStream, resps <-chan *discoveryv3.DiscoveryResponse, recvErr <-chan error) (healthy bool, err error) {
	types := map[string]*typeStream{}
	if err := c.sync(st, types); err != nil {
		return false, err
	}
	var held heldNACKs
	for {
		select {
		case <-ctx.Done():
			return healthy, ctx.Err()
		case err := <-recvErr:
			return healthy, fmt.Errorf("receiving: %w", err)
		case <-c.wake:
			if err := c.sync(st, types); err != nil {
				return healthy, err
			}
			held.keep(func(typeURL string) bool { return types[typeURL].sub != nil }) // not unsubscribed meanwhile
		case <-held.fire:
			for _, req := range held.due(time.Now()) {
				if err := st.Send(req); err != nil {
					return healthy, fmt.Errorf("sending the %s NACK: %w", req.GetTypeUrl(), err)
				}
			}
		case r := <-resps:
			healthy = true
			held.drop(r.GetTypeUrl()) // answered by what answers this newer response
			switch req, delay := c.handle(types, r); {
			case req == nil:
			case delay > 0:
				held.hold(req, time.Now().Add(delay))
			default:
				if err := st.Send(req); err != nil {
					return healthy, fmt.Errorf("sending the %s (N)ACK: %w", r.GetTypeUrl(), err)
				}
			}
		}
	}
}

// heldNACKs are the NACKs of one stream waiting out their delay, one per type URL, and the
// timer of the earliest (nil when none waits, so a select on it never fires).
type heldNACKs struct {
	by   map[string]heldNACK
	fire <-chan time.Time
}

// heldNACK is a NACK sent when its delay is over.
type heldNACK struct {
	req *discoveryv3.DiscoveryRequest
	at  time.Time
}

// hold keeps req, a NACK, until at, in place of any NACK of its type held already.
func (h *heldNACKs) hold(req *discoveryv3.DiscoveryRequest, at time.Time) {
	if h.by == nil {
		h.by = map[string]heldNACK{}
	}
	h.by[req.GetTypeUrl()] = heldNACK{req: req, at: at}
	h.rearm()
}

// drop forgets the NACK of typeURL, if one is held.
func (h *heldNACKs) drop(typeURL string) {
	if _, ok := h.by[typeURL]; ok {
		delete(h.by, typeURL)
		h.rearm()
	}
}

// keep forgets the NACKs of the types keep refuses.
func (h *heldNACKs) keep(keep func(typeURL string) bool) {
	for typeURL := range h.by {
		if !keep(typeURL) {
			delete(h.by, typeURL)
		}
	}
	h.rearm()
}

// due removes and returns the NACKs whose delay is over at now, by type URL.
func (h *heldNACKs) due(now time.Time) []*discoveryv3.DiscoveryRequest {
	var out []*discoveryv3.DiscoveryRequest
	for _, typeURL := range sortedKeys(h.by) {
		if hn := h.by[typeURL]; !now.Before(hn.at) {
			delete(h.by, typeURL)
			out = append(out, hn.req)
		}
	}
	h.rearm()
	return out
}

// rearm sets the timer for the earliest NACK held.
func (h *heldNACKs) rearm() {
	h.fire = nil
	var first time.Time
	for _, hn := range h.by {
		if first.IsZero() || hn.at.Before(first) {
			first = hn.at
		}
	}
	if !first.IsZero() {
		h.fire = time.After(time.Until(first))
	}
}

// sync sends a request for every subscription the stream has not asked for as it now
// stands (new, renamed, dropped).
func (c *Client) sync(st adsStream, types map[string]*typeStream) error {
	var reqs []*discoveryv3.DiscoveryRequest
	c.mu.Lock()
	for _, typeURL := range sortedKeys(c.subs) {
		s := c.subs[typeURL]
		ts := types[typeURL]
		if ts == nil || ts.sub != s {
			// New to this stream (or subscribed again): ask from the version last ACKed, so a
			// server that kept its state need not send it again.
			if ts == nil {
				ts = &typeStream{}
				types[typeURL] = ts
			}
			ts.sub, ts.names = s, nil
			if s.names != nil && len(s.names) == 0 && !ts.sent {
				continue // nothing to ask for, and an empty first request would be a wildcard
			}
		} else if slices.Equal(ts.names, sortedKeys(s.names)) {
			continue
		}
		reqs = append(reqs, c.requestLocked(ts, s.acked))
	}
	for typeURL, ts := range types {
		if c.subs[typeURL] != nil {
			continue
		}
		// Dropped: a named subscription tells the server with an empty list. A wildcard
		// one cannot be undone on a stream (an empty list keeps it); its responses are
		// ignored.
		if ts.sent && ts.names != nil {
			reqs = append(reqs, &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, ResponseNonce: ts.nonce, ResourceNames: []string{}})
		}
		ts.sub, ts.names = nil, nil
	}
	c.mu.Unlock()
	for _, r := range reqs {
		if err := st.Send(r); err != nil {
			return fmt.Errorf("sending the %s request: %w", r.GetTypeUrl(), err)
		}
	}
	return nil
}

// requestLocked builds the next request of ts's subscription, carrying its current names
// (every state-of-the-world request restates them), and records what it says.
func (c *Client) requestLocked(ts *typeStream, version string) *discoveryv3.DiscoveryRequest {
	s := ts.sub
	var names []string
	if s.names != nil {
		names = sortedKeys(s.names) // non-nil even when empty: no names, not a wildcard
	}
	r := &discoveryv3.DiscoveryRequest{
		TypeUrl:       s.typeURL,
		VersionInfo:   version,
		ResourceNames: names,
		ResponseNonce: ts.nonce,
	}
	if !ts.sent {
		r.Node = c.node // the first request of each type carries the node
	}
	ts.sent, ts.names = true, names
	return r
}

// handle decodes a response and has the handler apply it; it returns the ACK or NACK to
// send (nil for a type not subscribed) and how long to hold it.
func (c *Client) handle(types map[string]*typeStream, resp *discoveryv3.DiscoveryResponse) (*discoveryv3.DiscoveryRequest, time.Duration) {
	typeURL := resp.GetTypeUrl()
	c.mu.Lock()
	ts := types[typeURL]
	var s *subscription
	if ts != nil {
		ts.nonce = resp.GetNonce()
		s = ts.sub
	}
	if s == nil || c.subs[typeURL] != s {
		c.mu.Unlock()
		c.log.Debug("response for a type not subscribed", zap.String("type", typeURL))
		return nil, 0
	}
	var names map[string]bool
	if s.names != nil {
		names = maps.Clone(s.names)
	}
	c.mu.Unlock()

	version := resp.GetVersionInfo()
	result := resultApplied
	res, err := decode(resp, names)
	switch {
	case err != nil:
		result = resultRejected
	case s.hasApplied && sameResources(res, s.applied):
		result = resultUnchanged
	case s.rejected != nil && sameResources(res, s.rejected):
		result, err = resultRejected, errors.New(s.rejectReason)
	default:
		if err = s.handler(version, res); err != nil {
			result = resultRejected
			s.rejected, s.rejectReason = res, err.Error()
		} else {
			s.applied, s.hasApplied, s.rejected = res, true, nil
		}
	}

	c.mu.Lock()
	c.counts[updateKey{typeURL, result}]++
	appliedLog := c.appliedLog[typeURL]
	if appliedLog == nil {
		appliedLog = &Sampled{Log: c.log, Every: ApplyLogEvery}
		c.appliedLog[typeURL] = appliedLog
	}
	var req *discoveryv3.DiscoveryRequest
	var delay time.Duration
	if err != nil {
		req = c.requestLocked(ts, s.acked)
		req.ErrorDetail = status.New(codes.InvalidArgument, err.Error()).Proto()
		if s.nacks > 0 {
			b := backoff{cfg: c.cfg.Backoff, attempt: s.nacks - 1}
			delay = b.ceiling()
		}
		s.nacks++
	} else {
		s.acked, s.nacks = version, 0
		c.lastUpdate = time.Now()
		req = c.requestLocked(ts, version)
	}
	c.mu.Unlock()

	if err != nil {
		c.log.Warn("rejected an xDS update", zap.String("type", typeURL), zap.String("version", version),
			zap.String("kept_version", req.GetVersionInfo()), zap.Duration("nack_delay", delay), zap.Error(err))
	} else if result == resultApplied {
		appliedLog.Info("applied an xDS update", zap.String("type", typeURL), zap.String("version", version),
			zap.Int("resources", len(res)))
	}
	return req, delay
}

func sortedKeys[V any](m map[string]V) []string {
	if m == nil {
		return nil
	}
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
