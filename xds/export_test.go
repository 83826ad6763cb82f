package xds

import "google.golang.org/protobuf/proto"

// Validate checks m as Envoy would before it is served: PGV rules (ValidateAll) on m and on
// every message packed in an Any inside it, which PGV does not open, and the semantic checks
// Envoy makes that PGV cannot express. (The server validates through its validator; tests
// check single messages with this.)
func Validate(m proto.Message) error { return newValidator().validate(m) }
