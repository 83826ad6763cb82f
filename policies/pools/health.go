package pools

import (
	"github.com/stickylb/stickylb/policies/health"
)

// CheckerConfig is the health checker configuration of hc, for the tiers that probe
// (the xDS server and the XDP loader).
func (hc *HealthCheck) CheckerConfig() health.Config {
	return health.Config{
		Protocol:           health.Protocol(hc.Protocol),
		Path:               hc.Path,
		ExpectStatus:       hc.ExpectStatus,
		Port:               hc.Port,
		Interval:           hc.Interval,
		Timeout:            hc.Timeout,
		HealthyThreshold:   hc.HealthyThreshold,
		UnhealthyThreshold: hc.UnhealthyThreshold,
	}
}

// HealthTargets are the service's backends as health targets: identity and the address to
// probe (the bare IP for icmp checks).
func (s *Service) HealthTargets() []health.Target {
	ts := make([]health.Target, 0, len(s.Backends))
	for _, b := range s.Backends {
		addr := b.Address
		if s.HealthCheck != nil && s.HealthCheck.Protocol == HealthICMP {
			addr = b.AddrPort().Addr().String()
		}
		ts = append(ts, health.Target{ID: b.Identity(), Address: addr})
	}
	return ts
}

// HealthServices are the services that have a health_check, as a health.Monitor checks
// them.
func HealthServices(services []*Service) []health.Service {
	var out []health.Service
	for _, s := range services {
		if s.HealthCheck != nil {
			out = append(out, health.Service{Name: s.Name, Config: s.HealthCheck.CheckerConfig(), Targets: s.HealthTargets()})
		}
	}
	return out
}
