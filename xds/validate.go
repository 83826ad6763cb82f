package xds

import (
	"errors"
	"fmt"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	maglevv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/maglev/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/stickylb/stickylb/policies/chash"
)

type allValidator interface{ ValidateAll() error }

// Validate checks m as Envoy would before it is served: PGV rules (ValidateAll) on m and on
// every message packed in an Any inside it, which PGV does not open, and the semantic checks
// Envoy makes that PGV cannot express.
func Validate(m proto.Message) error {
	if err := validateTree(m.ProtoReflect(), string(m.ProtoReflect().Descriptor().FullName())); err != nil {
		return err
	}
	return semantic(m)
}

func validateTree(m protoreflect.Message, path string) error {
	if v, ok := m.Interface().(allValidator); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	if a, ok := m.Interface().(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("%s: opening %s: %w", path, a.GetTypeUrl(), err)
		}
		if err := validateTree(inner.ProtoReflect(), path+"("+string(inner.ProtoReflect().Descriptor().FullName())+")"); err != nil {
			return err
		}
		if err := semantic(inner); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		return nil
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind {
			return true
		}
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = validateTree(l.Get(i).Message(), fmt.Sprintf("%s[%d]", p, i))
			}
		case fd.IsMap():
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
					err = validateTree(mv.Message(), fmt.Sprintf("%s[%v]", p, k.Interface()))
					return err == nil
				})
			}
		default:
			err = validateTree(v.Message(), p)
		}
		return err == nil
	})
	return err
}

// semantic holds the checks Envoy makes beyond PGV.
func semantic(m proto.Message) error {
	switch x := m.(type) {
	case *maglevv3.Maglev:
		if ts := x.GetTableSize(); ts != nil && !chash.IsPrime(ts.GetValue()) {
			return fmt.Errorf("maglev table_size %d is not prime", ts.GetValue())
		}
	case *hcmv3.HttpConnectionManager:
		fs := x.GetHttpFilters()
		if len(fs) == 0 || fs[len(fs)-1].GetName() != "envoy.filters.http.router" {
			return errors.New("http_connection_manager: the router filter must be last")
		}
		for _, f := range fs[:len(fs)-1] {
			if f.GetName() == "envoy.filters.http.router" {
				return errors.New("http_connection_manager: the router filter appears before the last position")
			}
		}
	case *clusterv3.Cluster:
		if x.GetLbPolicy() != clusterv3.Cluster_ROUND_ROBIN && x.GetLoadBalancingPolicy() != nil {
			return fmt.Errorf("cluster %s: lb_policy and load_balancing_policy both set", x.GetName())
		}
		if x.GetLoadBalancingPolicy() == nil {
			return fmt.Errorf("cluster %s: no load_balancing_policy (stickylb never relies on lb_policy)", x.GetName())
		}
	case *listenerv3.Listener:
		if x.GetAddress() == nil && x.GetApiListener() == nil {
			return fmt.Errorf("listener %s: neither an address nor an api_listener", x.GetName())
		}
	}
	return nil
}

// ValidateAll validates every resource of r.
func (r *Resources) ValidateAll() error {
	for _, group := range [][]proto.Message{r.Listeners, r.Routes, r.Clusters, r.Endpoints} {
		for _, m := range group {
			if err := Validate(m); err != nil {
				return err
			}
		}
	}
	return nil
}
