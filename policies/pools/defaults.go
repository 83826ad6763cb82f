package pools

// applyDefaults fills in every omitted field of s; it is the only place
// defaults are set, and it runs after decoding and before the cross-field
// rules. given reports whether a dotted field path was written, which
// matters where the zero value is itself legal (cross_zone: false,
// min_weight_percent: 0).
//
//	affinity                   mode none when the block is omitted
//	affinity.ttl               30m (DefaultTTL)
//	affinity.max_sessions      100000 (DefaultMaxSessions)
//	affinity.cookie            mode cookie: name lb_session, path /
//	affinity.app_cookie.mode   prefix
//	affinity.quic_cid          mode quic_cid: cid_length 8
//	balance                    maglev for VIP services (the one every XDP
//	                           node agrees on behind ECMP); ring_hash for keyed modes
//	                           (the one hash Caddy, Envoy and gRPC share);
//	                           weighted_least_conn otherwise
//	idle_timeout               vip services: udp 300s, tcp 900s
//	forwarding                 vip services: auto (a backend without its own
//	                           inherits the service's)
//	tunnel_port                forwarding tunnel: 6080 (DefaultTunnelPort)
//	second_chance              forwarding tunnel: true
//	hash.table_size            maglev, and vip services of any balance
//	                           (their Maglev table of moved flows): 65537
//	hash.min/max_ring_size     maglev and ring_hash: 1024 / 4096 (gRPC's cap)
//	hash.bounded_load          0 (off: bounded load trades agreement away)
//	slow_start                 aggression 1.0, min_weight_percent 10
//	                           (window has no default: it is required)
//	health_check.protocol      http for http services, icmp for udp, tcp
//	                           otherwise
//	health_check.path          / (http checks only)
//	health_check.interval      5s, timeout min(2s, interval/2),
//	                           healthy_threshold 2, unhealthy_threshold 3
//	                           (health.Config.WithDefaults: the checker's own)
//	cross_zone                 true
//	backend weight             1
//
// Blocks that do not match the mode (a cookie block under mode url) are left
// as written so that the rules can reject them.
func applyDefaults(s *Service, given func(path string) bool) {
	defaultAffinity(&s.Affinity)
	defaultBalance(s)
	defaultProbes(s, given)
	if s.VIP != "" && s.Forwarding == "" {
		s.Forwarding = ForwardingAuto
	}
	if s.Forwarding == ForwardingTunnel {
		if s.TunnelPort == 0 {
			s.TunnelPort = DefaultTunnelPort
		}
		if !given("second_chance") {
			s.SecondChance = true
		}
	}
	if !given("cross_zone") {
		s.CrossZone = true
	}
	for _, b := range s.Backends {
		if b.Weight == 0 {
			b.Weight = DefaultWeight
		}
	}
}

func defaultAffinity(a *Affinity) {
	if a.Mode == "" {
		a.Mode = ModeNone
	}
	if a.TTL == 0 {
		a.TTL = DefaultTTL
	}
	if a.MaxSessions == 0 {
		a.MaxSessions = DefaultMaxSessions
	}
	switch a.Mode {
	case ModeCookie:
		if a.Cookie == nil {
			a.Cookie = &Cookie{}
		}
		if a.Cookie.Name == "" {
			a.Cookie.Name = DefaultCookieName
		}
		if a.Cookie.Path == "" {
			a.Cookie.Path = DefaultCookiePath
		}
	case ModeAppCookie:
		// The block itself is required (it names the cookie); its mode is not.
		if a.AppCookie != nil && a.AppCookie.Mode == "" {
			a.AppCookie.Mode = DefaultAppCookieMode
		}
	case ModeQUICCID:
		if a.QUICCID == nil {
			a.QUICCID = &QUICCID{}
		}
		if a.QUICCID.CIDLength == 0 {
			a.QUICCID.CIDLength = DefaultCIDLength
		}
	}
}

// defaultBalance picks the balance and the hash sizes.
func defaultBalance(s *Service) {
	a := &s.Affinity
	if s.VIP != "" && s.IdleTimeout == 0 {
		s.IdleTimeout = DefaultTCPIdleTimeout
		if s.Protocol == ProtocolUDP {
			s.IdleTimeout = DefaultUDPIdleTimeout
		}
	}
	if s.Balance == "" {
		switch {
		case s.VIP != "":
			s.Balance = BalanceMaglev
		case a.Keyed():
			s.Balance = BalanceRingHash
		default:
			s.Balance = BalanceLeastConn
		}
	}
	if s.vipTableOnly() && s.Hash.TableSize == 0 {
		s.Hash.TableSize = DefaultTableSize
	}
	if s.Balance == BalanceMaglev || s.Balance == BalanceRingHash {
		h := &s.Hash
		if s.Balance == BalanceMaglev && h.TableSize == 0 {
			h.TableSize = DefaultTableSize
		}
		if h.MinRingSize == 0 {
			h.MinRingSize = DefaultMinRingSize
		}
		if h.MaxRingSize == 0 {
			h.MaxRingSize = DefaultMaxRingSize
		}
	}
}

// defaultProbes fills in slow start and health checking, when the service has them.
func defaultProbes(s *Service, given func(path string) bool) {
	if ss := s.SlowStart; ss != nil {
		if ss.Aggression == 0 {
			ss.Aggression = DefaultAggression
		}
		if !given("slow_start.min_weight_percent") {
			ss.MinWeightPercent = DefaultMinWeightPercent
		}
	}

	if hc := s.HealthCheck; hc != nil {
		if hc.Protocol == "" {
			switch s.Protocol {
			case ProtocolHTTP:
				hc.Protocol = HealthHTTP
			case ProtocolUDP:
				hc.Protocol = HealthICMP
			default:
				hc.Protocol = HealthTCP
			}
		}
		// The checker's defaults, so what validate accepts is what the checker runs.
		c := hc.CheckerConfig().WithDefaults()
		hc.Path, hc.Interval, hc.Timeout = c.Path, c.Interval, c.Timeout
		hc.HealthyThreshold, hc.UnhealthyThreshold = c.HealthyThreshold, c.UnhealthyThreshold
	}
}
