package integration

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// fleetLoad is steady traffic from the client through the fleet: long-lived connections,
// each exchanging a line every loadEvery with its backend for a life of its own, and new
// connections opened one after another. Every connection is kept, with how it ended, so
// broken ones can be put down to the events that fell inside their lives.
type fleetLoad struct {
	rf   *routedFleet
	addr string // VIP:port the load goes to

	mu    sync.Mutex
	conns []*loadConn
	stop  chan struct{}
	wg    sync.WaitGroup
	live  map[*loadConn]net.Conn
	pings int // exchanges of the long-lived connections that went through
}

// progress is how many connections are open and how many exchanges went through so far.
func (l *fleetLoad) progress() (open, pings int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.live), l.pings
}

// loadConn is one connection of the load.
type loadConn struct {
	long          bool
	local, remote netip.AddrPort
	backend       string // the backend that answered (empty: it never answered)
	opened, ended time.Time
	last          time.Time // its last exchange that went through
	err           error     // why it broke; nil when it ended on purpose (or is open)
}

const (
	// loadEvery is how often a long-lived connection exchanges a line.
	loadEvery = 200 * time.Millisecond
	// loadWait is how long one exchange may take before the connection counts as broken:
	// long enough for TCP's retransmissions to carry a flow over a router that withdraws a
	// silent node after the hold time (3 s), so only a reset or a stall counts.
	loadWait = 15 * time.Second
)

// startLoad starts long long-lived connections, each living minLife to maxLife (0: until
// stopped), and newConns goroutines that open short connections one after another,
// every newEvery.
func (rf *routedFleet) startLoad(addr string, long int, minLife, maxLife time.Duration, newConns int, newEvery time.Duration) *fleetLoad {
	l := &fleetLoad{rf: rf, addr: addr, stop: make(chan struct{}), live: map[*loadConn]net.Conn{}}
	for i := 0; i < long; i++ {
		l.wg.Add(1)
		go l.longWorker(minLife, maxLife)
	}
	for i := 0; i < newConns; i++ {
		l.wg.Add(1)
		go l.newWorker(newEvery)
	}
	rf.root.Cleanup(l.end)
	return l
}

// end stops the load and closes its connections.
func (l *fleetLoad) end() {
	l.mu.Lock()
	select {
	case <-l.stop:
		l.mu.Unlock()
		return
	default:
	}
	close(l.stop)
	for _, c := range l.live {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

func (l *fleetLoad) stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// open dials the VIP from the client and reads the backend's name.
func (l *fleetLoad) open(long bool) (*loadConn, net.Conn, *bufio.Reader) {
	lc := &loadConn{long: long, opened: time.Now()}
	var c net.Conn
	err := l.rf.kit.Do("cl", func() (err error) {
		c, err = net.DialTimeout("tcp", l.addr, loadWait)
		return err
	})
	var r *bufio.Reader
	if err == nil {
		lc.local, lc.remote = c.LocalAddr().(*net.TCPAddr).AddrPort(), c.RemoteAddr().(*net.TCPAddr).AddrPort()
		c.SetDeadline(time.Now().Add(loadWait))
		r = bufio.NewReader(c)
		var name string
		if name, err = r.ReadString('\n'); err == nil {
			lc.backend = strings.TrimSpace(name)
		} else {
			c.Close()
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.conns = append(l.conns, lc)
	if err != nil {
		if !l.stopped() {
			lc.err = fmt.Errorf("opening: %w", err)
		}
		lc.ended = time.Now()
		return lc, nil, nil
	}
	l.live[lc] = c
	return lc, c, r
}

// waitStreams waits until every open long-lived connection has exchanged a line since
// since (one that stalls longer breaks at loadWait, and is the broken count's), and says how
// long that took.
func (l *fleetLoad) waitStreams(t *testing.T, since time.Time) time.Duration {
	t.Helper()
	return testwait.For(t, loadWait+2*time.Second, "every stream exchanging again", func() (bool, string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		behind := 0
		for lc := range l.live {
			if lc.long && lc.last.Before(since) {
				behind++
			}
		}
		return behind == 0, fmt.Sprintf("%d streams without an exchange since %s", behind, since.Format("15:04:05.000"))
	})
}

// exchange sends a line and reads it back within loadWait.
func exchange(c net.Conn, r *bufio.Reader, msg string) error {
	c.SetDeadline(time.Now().Add(loadWait))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if line != msg+"\n" {
		return fmt.Errorf("echo %q", line)
	}
	return nil
}

// finish records how lc ended.
func (l *fleetLoad) finish(lc *loadConn, c net.Conn, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.live, lc)
	c.Close()
	lc.ended = time.Now()
	if err != nil && !l.stopped() {
		lc.err = err
	}
}

func (l *fleetLoad) longWorker(minLife, maxLife time.Duration) {
	defer l.wg.Done()
	for !l.stopped() {
		lc, c, r := l.open(true)
		if c == nil {
			time.Sleep(loadEvery) // pacing: a failed dial is retried
			continue
		}
		life := time.Duration(1<<62 - 1)
		if maxLife > 0 {
			life = minLife + rand.N(maxLife-minLife+1)
		}
		var err error
		for i := 0; err == nil && time.Since(lc.opened) < life && !l.stopped(); i++ {
			time.Sleep(loadEvery) // the stream's pace
			if err = exchange(c, r, fmt.Sprintf("ping %d", i)); err == nil {
				l.mu.Lock()
				l.pings++
				lc.last = time.Now()
				l.mu.Unlock()
			}
		}
		l.finish(lc, c, err)
	}
}

func (l *fleetLoad) newWorker(every time.Duration) {
	defer l.wg.Done()
	for !l.stopped() {
		start := time.Now()
		lc, c, r := l.open(false)
		if c != nil {
			l.finish(lc, c, exchange(c, r, "hello"))
		}
		time.Sleep(max(0, every-time.Since(start))) // the load's pace
	}
}

// snapshot copies the connections made so far.
func (l *fleetLoad) snapshot() []loadConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]loadConn, len(l.conns))
	for i, c := range l.conns {
		out[i] = *c
	}
	return out
}

// broken lists the connections that broke.
func (l *fleetLoad) broken() []loadConn {
	var out []loadConn
	for _, c := range l.snapshot() {
		if c.err != nil {
			out = append(out, c)
		}
	}
	return out
}

// breakReport puts each broken connection down to what broke it.
type breakReport struct {
	// Expected: connections whose own backend was killed or removed in their life (its
	// server is gone, or the LB forgets it): by that kind.
	Expected map[string]int
	// Combined: an LB-node change and a backend change both inside the connection's life
	// (the node the router moves it to has no entry for it, and the table moved): the
	// baseline that tunnelling to the first node ("second chance") must take to zero.
	// CombinedBy counts them by the last backend change in their life.
	Combined   int
	CombinedBy map[string]int
	// Reused: a connection with an LB-node change in its life, on a 5-tuple that an earlier
	// connection to another backend used, which ended without its FIN passing the node that
	// carried it (it broke, or an LB-node change moved it away): a node may hold that
	// connection's entry to the idle timeout and send this one's packets there once the
	// router moves it to that node. By the kind of the last event before they broke.
	Reused   int
	ReusedBy map[string]int
	// Events counts the events of each kind.
	Events map[string]int
	// ByKind: the others, by the kind of the last event before they broke ("none" when
	// none came before); Alone describes each of them.
	ByKind map[string]int
	Alone  []string
	// Total connections made, long-lived and new; Reuses, those on a 5-tuple an earlier
	// connection of the day used.
	Long, New, Reuses int
}

// killDetect bounds how long after a backend's death new connections may still be sent
// to it: the nodes' check (interval 1 s x 1 + timeout 0.5 s) and the rebuild, with slack.
const killDetect = 3 * time.Second

// connLife is what of a fleet's log fell inside a connection's life: an event falls inside
// when it was made before the connection ended and settled after it began.
type connLife struct {
	node    bool     // an LB-node change
	backend string   // the last backend change ("" when none)
	last    string   // the kind of the last event made before the connection ended ("none")
	own     string   // its own backend killed or removed (or, for a connection that never answered, a backend just killed)
	events  []string // the events, as "kind target"
}

func lifeOf(c loadConn, log []fleetEvent) connLife {
	l := connLife{last: "none"}
	for _, e := range log {
		if e.at.After(c.ended) {
			break
		}
		l.last = e.kind
		settled := e.settled
		if settled.IsZero() {
			settled = c.ended
		}
		if settled.Before(c.opened) {
			continue
		}
		l.events = append(l.events, e.kind+" "+e.target)
		l.node = l.node || e.node
		if !e.node {
			l.backend = e.kind
		}
		switch {
		case (e.kind == "backend kill" || e.kind == "backend remove") && e.target == c.backend:
			l.own = e.kind // its own backend died or left
		case e.kind == "backend kill" && c.backend == "" && c.ended.Sub(e.at) < killDetect:
			l.own = e.kind // a new connection sent to a backend just dead
		}
	}
	return l
}

// attribute puts the load's broken connections down to the events of log.
func attribute(conns []loadConn, log []fleetEvent) breakReport {
	rep := breakReport{Expected: map[string]int{}, ByKind: map[string]int{}, CombinedBy: map[string]int{},
		ReusedBy: map[string]int{}, Events: map[string]int{}}
	for _, e := range log {
		rep.Events[e.kind]++
	}
	byTuple := map[netip.AddrPort][]loadConn{} // the connections made on each client address and port
	for _, c := range conns {
		if c.local.IsValid() {
			if len(byTuple[c.local]) > 0 {
				rep.Reuses++
			}
			byTuple[c.local] = append(byTuple[c.local], c)
		}
	}
	for _, c := range conns {
		if c.long {
			rep.Long++
		} else {
			rep.New++
		}
		if c.err == nil {
			continue
		}
		l := lifeOf(c, log)
		switch {
		case l.own != "":
			rep.Expected[l.own]++
		case l.node && l.backend != "":
			rep.Combined++
			rep.CombinedBy[l.backend]++
		case l.node && len(staleBefore(c, byTuple[c.local], log)) > 0: // moved to a node that may hold one
			rep.Reused++
			rep.ReusedBy[l.last]++
		default:
			rep.ByKind[l.last]++
			rep.Alone = append(rep.Alone, fmt.Sprintf("%s -> %s, %s..%s: %v; in its life: %s; earlier on its 5-tuple: %s",
				c.local, c.backend, c.opened.Format("15:04:05.000"), c.ended.Format("15:04:05.000"), c.err,
				orNone(l.events), orNone(earlierOn(c, byTuple[c.local]))))
		}
	}
	return rep
}

// staleBefore lists the connections before c on its 5-tuple, to another backend, that a
// node may still hold an entry of: they ended without their FIN passing the node that
// carried them (they broke, or an LB-node change in their life moved them away).
func staleBefore(c loadConn, same []loadConn, log []fleetEvent) []loadConn {
	var out []loadConn
	for _, e := range same {
		if !e.opened.Before(c.opened) || e.backend == c.backend {
			continue
		}
		if e.err != nil || lifeOf(e, log).node {
			out = append(out, e)
		}
	}
	return out
}

// earlierOn describes the connections before c on its 5-tuple.
func earlierOn(c loadConn, same []loadConn) []string {
	var out []string
	for _, e := range same {
		if e.opened.Before(c.opened) {
			out = append(out, fmt.Sprintf("%s..%s -> %s (%v)", e.opened.Format("15:04:05.000"), e.ended.Format("15:04:05.000"), e.backend, e.err))
		}
	}
	return out
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// String lays the report out: per kind of event, how many there were and how many
// connections each broke alone; then the combined ones and the expected ones.
func (r breakReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "connections made: %d long-lived, %d new; %d on a 5-tuple used before that day\n", r.Long, r.New, r.Reuses)
	kinds := make([]string, 0, len(r.Events))
	for k := range r.Events {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(&b, "  %-22s %2d events, %d connections broken by it alone\n", k, r.Events[k], r.ByKind[k])
	}
	if n := r.ByKind["none"]; n > 0 {
		fmt.Fprintf(&b, "  broken with no event before them: %d\n", n)
	}
	fmt.Fprintf(&b, "broken with an LB-node change and a backend change in their life (the baseline): %d %s\n", r.Combined, counts(r.CombinedBy))
	fmt.Fprintf(&b, "broken on a 5-tuple whose earlier connection a node may still hold (it ended without its FIN there): %d %s\n", r.Reused, counts(r.ReusedBy))
	fmt.Fprintf(&b, "broken because their own backend died or left: %s", counts(r.Expected))
	return b.String()
}

// counts writes m as (k n, k n) in key order.
func counts(m map[string]int) string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return "(" + strings.Join(out, ", ") + ")"
}
