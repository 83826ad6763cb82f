package agent

// The TC program is built with Debian's clang and committed (backend_bpfel.o and its Go
// bindings), as the forwarder's are; `go generate ./l4xdp/agent` rebuilds it. Its C lives
// beside the forwarder's (../bpf/backend.c), sharing the tunnel's format (../bpf/gue.h).
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -mcpu=v3 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type agent_path -type agent_counter -type agent_prefix backend ../bpf/backend.c -- -I../bpf/headers -I../bpf
