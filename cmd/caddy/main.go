// Command caddy is Caddy with its standard modules and stickylb's, what
// `xcaddy build --with github.com/stickylb/stickylb@v0.0.0=$PWD` produces from a checkout
// (xcaddy.md):
//
//	go run ./cmd/caddy run --config Caddyfile.example
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/stickylb/stickylb/caddymodule"
)

func main() {
	caddycmd.Main()
}
