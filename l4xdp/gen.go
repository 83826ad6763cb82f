package l4xdp

// The BPF object is built with Debian's clang and committed (lb_bpfel.o, lb_bpfel.go), so a
// build needs no clang; `go generate ./l4xdp` rebuilds it.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type vip_key -type vip_meta -type backend -type flow -type conn -type server_key -type counter -type gen_config -type name lb bpf/lb.c -- -I./bpf/headers
