// Package stickylb registers stickylb's Caddy modules, so that
// `xcaddy build --with github.com/stickylb/stickylb@v0.0.0=$PWD` (from a checkout: the module
// is not published) builds a Caddy with them.
// The algorithms live in policies/, the modules in caddymodule/.
package stickylb

import (
	_ "github.com/stickylb/stickylb/caddymodule" // registers the Caddy modules
)
