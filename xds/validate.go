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

// validator remembers, per message type, whether an Any can sit anywhere below it: the walk
// for Anys skips the subtrees that cannot hold one (endpoints, addresses, most of a cluster).
type validator struct {
	holdsAny map[protoreflect.FullName]bool
}

func newValidator() *validator { return &validator{holdsAny: map[protoreflect.FullName]bool{}} }

func (v *validator) validate(m proto.Message) error {
	if err := v.tree(m.ProtoReflect(), true); err != nil {
		return fmt.Errorf("%s%w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return semantic(m)
}

// mayHoldAny says whether a message of type d can contain an Any. A type met again while
// its own answer is pending counts as yes: a recursive type is walked, never wrongly skipped.
func (v *validator) mayHoldAny(d protoreflect.MessageDescriptor) bool {
	name := d.FullName()
	if r, ok := v.holdsAny[name]; ok {
		return r
	}
	if name == "google.protobuf.Any" {
		v.holdsAny[name] = true
		return true
	}
	v.holdsAny[name] = true // pending
	r := false
	fs := d.Fields()
	for i := 0; i < fs.Len() && !r; i++ {
		f := fs.Get(i)
		if f.IsMap() {
			f = f.MapValue()
		}
		if f.Kind() == protoreflect.MessageKind || f.Kind() == protoreflect.GroupKind {
			r = v.mayHoldAny(f.Message())
		}
	}
	v.holdsAny[name] = r
	return r
}

// tree runs ValidateAll on a root (the resource, or what an Any holds), which covers its
// whole tree but the Anys in it, then walks the tree for those. Calling ValidateAll on every
// node, as this once did, validated each node once per ancestor. Errors carry the path from
// the resource, built only on the way out of a failure.
func (v *validator) tree(m protoreflect.Message, root bool) error {
	if root {
		if av, ok := m.Interface().(allValidator); ok {
			if err := av.ValidateAll(); err != nil {
				return fmt.Errorf(": %w", err)
			}
		}
	}
	if a, ok := m.Interface().(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf(": opening %s: %w", a.GetTypeUrl(), err)
		}
		name := inner.ProtoReflect().Descriptor().FullName()
		if err := v.tree(inner.ProtoReflect(), true); err != nil {
			return fmt.Errorf("(%s)%w", name, err)
		}
		if err := semantic(inner); err != nil {
			return fmt.Errorf("(%s): %w", name, err)
		}
		return nil
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, val protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() == protoreflect.MessageKind && v.mayHoldAny(fd.MapValue().Message()) {
				val.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
					if err = v.tree(mv.Message(), false); err != nil {
						err = fmt.Errorf(".%s[%v]%w", fd.Name(), k.Interface(), err)
					}
					return err == nil
				})
			}
		case fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind:
			// a scalar: nothing below it
		case !v.mayHoldAny(fd.Message()):
			// no Any can be below it: its root's ValidateAll covered it
		case fd.IsList():
			l := val.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				if err = v.tree(l.Get(i).Message(), false); err != nil {
					err = fmt.Errorf(".%s[%d]%w", fd.Name(), i, err)
				}
			}
		default:
			if err = v.tree(val.Message(), false); err != nil {
				err = fmt.Errorf(".%s%w", fd.Name(), err)
			}
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
	v := newValidator()
	for _, group := range [][]proto.Message{r.Listeners, r.Routes, r.Clusters, r.Endpoints} {
		for _, m := range group {
			if err := v.validate(m); err != nil {
				return err
			}
		}
	}
	return nil
}
