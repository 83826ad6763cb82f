package health

import "sync"

// subscriber delivers transitions to one channel without ever blocking the
// checker. While the channel has room and nothing is queued, offer sends
// directly. Otherwise transitions wait in pending, at most one per target,
// and a pump goroutine (started on demand, gone once the queue is empty)
// feeds the channel in order.
type subscriber struct {
	ch   chan Transition
	quit chan struct{} // closed by close

	mu       sync.Mutex
	pending  map[string]Transition
	order    []string // target IDs in the order their entries were queued
	pumping  bool
	pumpDone chan struct{} // closed when the current pump has exited
	closed   bool
	closeCh  sync.Once
}

func newSubscriber(buf int) *subscriber {
	return &subscriber{
		ch:      make(chan Transition, buf),
		quit:    make(chan struct{}),
		pending: make(map[string]Transition),
	}
}

// offer queues tr. spawn starts a pump on a goroutine the checker waits for;
// it is called with the checker's lock held.
func (s *subscriber) offer(tr Transition, spawn func(func(stop <-chan struct{}))) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if !s.pumping && len(s.order) == 0 {
		select {
		case s.ch <- tr:
			return
		default:
		}
	}
	if old, ok := s.pending[tr.ID]; ok {
		tr.Coalesced += old.Coalesced + 1
		s.pending[tr.ID] = tr
	} else {
		s.pending[tr.ID] = tr
		s.order = append(s.order, tr.ID)
	}
	if !s.pumping {
		s.pumping = true
		done := make(chan struct{})
		s.pumpDone = done
		spawn(func(stop <-chan struct{}) { s.pump(stop, done) })
	}
}

func (s *subscriber) pump(stop <-chan struct{}, done chan struct{}) {
	defer close(done)
	for {
		s.mu.Lock()
		tr, ok := s.popLocked()
		if !ok || s.closed {
			s.pumping = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		select {
		case s.ch <- tr:
		case <-s.quit:
			return
		case <-stop:
			return
		}
	}
}

func (s *subscriber) popLocked() (Transition, bool) {
	for len(s.order) > 0 {
		id := s.order[0]
		s.order = s.order[1:]
		if tr, ok := s.pending[id]; ok {
			delete(s.pending, id)
			if len(s.order) == 0 {
				s.order = nil
			}
			return tr, true
		}
	}
	s.order = nil
	return Transition{}, false
}

// purge drops queued transitions of removed targets; nobody routes to them
// any more, and keeping them would let target churn grow the queue.
func (s *subscriber) purge(ids []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.pending)
	for _, id := range ids {
		delete(s.pending, id)
	}
	if len(s.pending) == n {
		return
	}
	kept := s.order[:0]
	seen := make(map[string]bool, len(s.pending))
	for _, id := range s.order {
		if _, ok := s.pending[id]; ok && !seen[id] {
			seen[id] = true
			kept = append(kept, id)
		}
	}
	s.order = kept
}

// close stops delivery, waits for the pump and closes the channel. It may
// be called more than once and from the checker and the subscriber at once.
func (s *subscriber) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.quit)
	done := s.pumpDone
	s.pending, s.order = nil, nil
	s.mu.Unlock()
	if done != nil {
		<-done
	}
	s.closeCh.Do(func() { close(s.ch) })
}
