package api

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/stickylb/stickylb/policies/pools"
)

// The change API edits the stored pools file as a YAML node tree, so `pools get` shows
// its changes in the operator's file: comments, key order, quoting and flow or block
// style are kept; blank lines are not (yaml.v3 does not keep them) and indentation is
// re-made at two spaces; a flow mapping's value holding ':' is quoted.

// errNotFound is a service, backend or zone the file does not have.
type errNotFound struct{ what string }

func (e errNotFound) Error() string { return e.what }

// errExists is a backend added under an identity the service has already.
type errExists struct{ what string }

func (e errExists) Error() string { return e.what }

// errUnsupported is a change the API cannot make by editing nodes (a node shared through
// an alias): the operator edits the file instead.
var errUnsupported = errors.New("this part of the pools file is written through a YAML alias or merge key: change it in the file (`stickylb pools get`, then `stickylb pools apply`)")

// doc is a parsed pools file being edited.
type doc struct{ root *yaml.Node } // the document's top mapping

func parseDoc(data []byte) (*doc, error) {
	var n yaml.Node
	if err := yaml.Unmarshal(data, &n); err != nil {
		return nil, err
	}
	if n.Kind != yaml.DocumentNode || len(n.Content) == 0 || n.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("the stored pools file is not a mapping")
	}
	return &doc{root: &n}, nil
}

func (d *doc) top() *yaml.Node { return d.root.Content[0] }

// encode writes the document back, at two spaces of indentation.
func (d *doc) encode() ([]byte, error) {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(d.root); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// value is the value node of key in mapping m (nil when absent).
func value(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// set puts key: v in mapping m, replacing its value (and keeping its comments) when the key
// is there, else appending it.
func set(m *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			old := m.Content[i+1]
			v.LineComment, v.HeadComment, v.FootComment = old.LineComment, old.HeadComment, old.FootComment
			m.Content[i+1] = v
			return
		}
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
}

// unset removes key from mapping m.
func unset(m *yaml.Node, key string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content = slices.Delete(m.Content, i, i+2)
			return
		}
	}
}

func scalar(tag, v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: v} }

// plain refuses nodes reached through aliases and mappings with merge keys: editing them
// would change every place that names them, or be overridden.
func plain(n *yaml.Node) error {
	if n == nil || n.Kind == yaml.AliasNode || n.Anchor != "" {
		return errUnsupported
	}
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == "<<" || n.Content[i+1].Kind == yaml.AliasNode {
				return errUnsupported
			}
		}
	}
	return nil
}

// service is the mapping of the service named name.
func (d *doc) service(name string) (*yaml.Node, error) {
	list := value(d.top(), "services")
	if list == nil || list.Kind != yaml.SequenceNode {
		return nil, errNotFound{fmt.Sprintf("no service %q in the pools file", name)}
	}
	for _, s := range list.Content {
		if s.Kind == yaml.MappingNode {
			if v := value(s, "name"); v != nil && v.Value == name {
				return s, plain(s)
			}
		}
	}
	return nil, errNotFound{fmt.Sprintf("no service %q in the pools file", name)}
}

// identity is a backend mapping's identity as the pools file defines it: its hash_key when
// set, else its address.
func identity(b *yaml.Node) string {
	for b.Kind == yaml.AliasNode {
		b = b.Alias
	}
	if b.Kind != yaml.MappingNode {
		return ""
	}
	if v := value(b, "hash_key"); v != nil && v.Value != "" {
		return v.Value
	}
	if v := value(b, "address"); v != nil {
		return v.Value
	}
	return ""
}

// backends is the service's backends list (made when absent).
func backends(svc *yaml.Node) (*yaml.Node, error) {
	list := value(svc, "backends")
	if list == nil {
		list = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		set(svc, "backends", list)
	}
	if list.Kind != yaml.SequenceNode {
		return nil, errUnsupported
	}
	return list, nil
}

// backend is the index and mapping of the backend with identity id in svc's list.
func backend(svc *yaml.Node, id string) (*yaml.Node, int, error) {
	list, err := backends(svc)
	if err != nil {
		return nil, -1, err
	}
	for i, b := range list.Content {
		if identity(b) == id {
			return list, i, plain(b)
		}
	}
	return list, -1, nil
}

// zoneList edits the service's drained_zones: add or remove zone. The key goes when the
// list is empty.
func zoneList(svc *yaml.Node, zone string, drain bool) error {
	list := value(svc, "drained_zones")
	if list == nil {
		if !drain {
			return nil
		}
		list = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Style: yaml.FlowStyle}
		set(svc, "drained_zones", list)
	}
	if list.Kind != yaml.SequenceNode {
		return errUnsupported
	}
	i := slices.IndexFunc(list.Content, func(n *yaml.Node) bool { return n.Value == zone })
	switch {
	case drain && i < 0:
		list.Content = append(list.Content, scalar("!!str", zone))
	case !drain && i >= 0:
		list.Content = slices.Delete(list.Content, i, i+1)
	}
	if len(list.Content) == 0 {
		unset(svc, "drained_zones")
	}
	return nil
}

// fieldNode is a backend field's JSON value as YAML: strings, numbers and booleans; null
// removes the field.
func fieldNode(name string, v any) (*yaml.Node, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case string:
		return scalar("!!str", x), nil
	case bool:
		return scalar("!!bool", strconv.FormatBool(x)), nil
	case float64:
		if x == float64(int64(x)) {
			return scalar("!!int", strconv.FormatInt(int64(x), 10)), nil
		}
		return scalar("!!float", strconv.FormatFloat(x, 'g', -1, 64)), nil
	}
	return nil, fmt.Errorf("%s: want a string, a number, a boolean or null", name)
}

// pathError names an error of data (a pools file that does not validate) by its path in
// the file (services[web].backends[10.0.1.1:8080].weight) rather than its line: the
// operator of the API never saw the lines.
func pathError(data []byte) func(*pools.Error) string {
	var root yaml.Node
	_ = yaml.Unmarshal(data, &root)
	return func(e *pools.Error) string {
		p := pathAt(&root, e.Line, e.Col)
		if p == "" {
			return e.Msg
		}
		msg := e.Msg
		// The message may start with the field's name ("weight: want an integer", "weight
		// 0: want 1..10000"): the path ends with it already.
		if last := p[strings.LastIndexAny(p, ".]")+1:]; last != "" {
			if m, ok := strings.CutPrefix(msg, last+": "); ok {
				msg = m
			} else {
				msg = strings.TrimPrefix(msg, last+" ")
			}
		}
		return p + ": " + msg
	}
}

// pathAt is the path of the deepest node at line:col in the tree (services[NAME] for a
// service, backends[IDENTITY] for a backend, [i] in other lists), "" for none.
func pathAt(n *yaml.Node, line, col int) string {
	best := ""
	var walk func(n *yaml.Node, path, key string)
	walk = func(n *yaml.Node, path, key string) {
		if n == nil {
			return
		}
		if n.Line == line && (n.Column == col || col == 0) && len(path) >= len(best) {
			best = path
		}
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path, key)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				sub := k.Value
				if path != "" {
					sub = path + "." + k.Value
				}
				walk(k, sub, k.Value)
				walk(v, sub, k.Value)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				name := strconv.Itoa(i)
				switch key {
				case "services":
					if v := value(c, "name"); c.Kind == yaml.MappingNode && v != nil {
						name = v.Value
					}
				case "backends":
					if id := identity(c); id != "" {
						name = id
					}
				}
				walk(c, path+"["+name+"]", "")
			}
		}
	}
	walk(n, "", "")
	return best
}
