package l4xdp

// The BPF objects are built with Debian's clang and committed (*_bpfel.o and their Go
// bindings), so a build needs no clang; `go generate ./l4xdp` rebuilds them:
//   - lb: the forwarder, the only object `stickylb xdp` loads (-mcpu=v3: its connection
//     counts need 32-bit atomic fetch-and-and, kernel 5.12 and later);
//   - pass: the XDP_PASS program of `stickylb xdp pass`;
//   - testprogs (bindings in a _test.go file, so only test binaries embed it): the
//     benchmarks' floors, the live-frames generator and sink.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -mcpu=v3 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type vip_key -type vip_meta -type backend -type flow -type conn -type server_key -type counter -type name -type lb_config -type wlc_pool -type nat_key -type nat_entry -type nat_source lb bpf/lb.c -- -I./bpf/headers
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel pass bpf/pass.c -- -I./bpf/headers
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -output-suffix _test -type gen_config -type floor_target testprogs bpf/testprogs.c -- -I./bpf/headers
