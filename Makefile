# Cubicle build and test entry points. `make test` is what CI runs.
GO          ?= go
BIN         := bin
GOFLAGS_BIN := CGO_ENABLED=0
PKGS        := ./...

.PHONY: build guest-kernel test unit e2e bench run lint fuzz soak clean proto FORCE

build: $(BIN)/cubicle $(BIN)/cubicle-agent $(BIN)/runsc $(BIN)/buildkitd $(BIN)/buildctl

# The cubicle binary is static: it is bind-mounted into every sandbox as the agent.
$(BIN)/cubicle: FORCE
	$(GOFLAGS_BIN) $(GO) build -o $@ ./cmd/cubicle

# The small in-sandbox binary (PID 1, sudo, set-identity): the daemon binds
# it into sandboxes instead of itself when it is beside cubicle, because it
# starts sooner inside gVisor (see cmd/cubicle-agent).
$(BIN)/cubicle-agent: FORCE
	$(GOFLAGS_BIN) $(GO) build -o $@ ./cmd/cubicle-agent

# runsc is built from the Go module proxy at the version pinned in
# tools/runsc/go.mod (a separate module so gVisor's dependency graph never
# touches ours), with its seccomp filters precompiled and cached per
# machine under /var/cache/cubicle/runsc (see tools/runsc/build.sh).
$(BIN)/runsc: tools/runsc/go.mod tools/runsc/go.sum tools/runsc/precompile/main.go tools/runsc/build.sh
	GO=$(GO) tools/runsc/build.sh $@

# BuildKit's daemon and client go into the built-in builder snapshot (the
# official clients' createSnapshotFromDockerfile runs them); the daemon
# finds them next to the cubicle binary. Pinned in tools/buildkit/go.mod,
# a separate module like runsc's.
$(BIN)/buildkitd $(BIN)/buildctl &: tools/buildkit/go.mod tools/buildkit/go.sum
	cd tools/buildkit && $(GOFLAGS_BIN) $(GO) build -o ../../$(BIN)/ github.com/moby/buildkit/cmd/buildkitd github.com/moby/buildkit/cmd/buildctl

# The real object-store servers the data-mount tests start on loopback
# (internal/mounts/mountstest): versitygw (S3, posix backend) and
# fake-gcs-server (the GCS emulator), each pinned in its own tools module.
# The tests build them on demand when these have not been.
TEST_SERVERS := $(BIN)/versitygw $(BIN)/fake-gcs-server

$(BIN)/versitygw: tools/versitygw/go.mod tools/versitygw/go.sum
	cd tools/versitygw && $(GOFLAGS_BIN) $(GO) build -o ../../$(BIN)/versitygw github.com/versity/versitygw/cmd/versitygw

$(BIN)/fake-gcs-server: tools/fakegcs/go.mod tools/fakegcs/go.sum
	cd tools/fakegcs && $(GOFLAGS_BIN) $(GO) build -o ../../$(BIN)/fake-gcs-server github.com/fsouza/fake-gcs-server

# The microVM runtime's guest kernel (internal/runtime/microvm), built from
# Debian's linux-source package with tools/guestkernel/microvm.config and
# cached per machine under /var/cache/cubicle/guest-kernel: the first build
# takes about 20 CPU-minutes, later ones are a copy.
guest-kernel: $(BIN)/vmlinux

$(BIN)/vmlinux: tools/guestkernel/microvm.config tools/guestkernel/build.sh
	tools/guestkernel/build.sh $@

STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

lint:
	@out=$$(gofmt -l cmd internal sdk test); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) $(PKGS)

# Packages run one at a time (-p 1): several of them program the host's
# nftables and network namespaces. Within a package, the few tests marked
# parallel (those that mostly wait: the conformance passes, a stalled
# reader) run side by side once its other tests are done: -parallel lets
# them all at once, as GOMAXPROCS (2 here) would not.
test: build guest-kernel $(TEST_SERVERS) lint
	$(GO) test -p 1 -parallel 8 -count=1 -timeout 40m $(PKGS)
	$(MAKE) fuzz

# Each parser of untrusted input has a native Go fuzz target
# (package:Func:execs). `go test` above replays their seeds and
# testdata/fuzz regressions; here each one is fuzzed for a fixed number of
# executions (go test -fuzz takes one target at a time), sized to about ten
# seconds of fuzzing at the rates a clean-clone CI run on this machine
# printed (the earlier sizes took 300 s for the nine). Interesting inputs
# accumulate in GOCACHE's fuzz corpus, so runs on one machine build on each
# other. The budget is a count, not a duration: Go 1.26's fuzz coordinator
# can fail a duration-bounded run with a spurious "context deadline
# exceeded" when the deadline races a worker's in-flight input
# (go.dev/issue/75804, fixed in Go 1.27); a count has no deadline.
# FUZZSCALE multiplies every budget (e.g. FUZZSCALE=10 for a long run).
# Minimizing each new input is capped at FUZZMINIMIZE runs so a short run
# spends its time exploring (the unpacker's coverage varies from run to run,
# and unbounded minimization took the whole budget); a crasher is still
# written to testdata/fuzz.
FUZZSCALE    ?= 1
FUZZMINIMIZE ?= 20x
FUZZ_TARGETS := \
	./internal/image:FuzzUnpackLayer:7000 \
	./internal/proxy:FuzzParsePolicy:20000 \
	./internal/mounts:FuzzParse:24000 \
	./internal/proxy:FuzzAWSEndpoint:25000 \
	./internal/proxy:FuzzServeDNS:30000 \
	./internal/gateway:FuzzVerify:25000 \
	./internal/api:FuzzDecode:15000 \
	./internal/agent:FuzzClientAnswers:50000 \
	./internal/agent:FuzzExecFrames:11000

# The long soak: 50 gVisor sandboxes × mixed work for 10 minutes, the
# daemon's RSS, fds and goroutines checked for growth (CI runs a short
# profile of the same test: 8 sandboxes, 75 s), then a 10 GiB upload
# checked for constant daemon memory (CI uploads 2 GiB), then density
# (500 idle gVisor sandboxes; CI runs 20) and the 100-create burst held to
# its 10 s target (CI holds it to 30 s).
soak: build $(TEST_SERVERS)
	CUBICLE_SOAK=10m CUBICLE_SOAK_SANDBOXES=50 CUBICLE_UPLOAD_BYTES=10GiB CUBICLE_DENSITY=500 CUBICLE_BURST_DEADLINE=10s \
		$(GO) test -p 1 -count=1 -timeout 60m -run '^(TestSoak|TestLargeUpload|TestDensity|TestBurstCreates)$$' -v ./test/e2e/

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; fn=$${rest%%:*}; n=$$(( $${rest##*:} * $(FUZZSCALE) )); \
		echo "fuzz $$fn in $$pkg for $$n executions"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $${n}x -fuzzminimizetime $(FUZZMINIMIZE) $$pkg; \
	done

e2e: build
	$(GO) test -p 1 -count=1 -timeout 20m -v ./test/e2e/

bench: build
	$(GO) test -p 1 -run '^$$' -bench . -benchtime 10x ./test/e2e/

# proto regenerates the E2B door's envd API code (committed, so builds and
# CI need no generator): protoc from apt's protobuf-compiler, the plugins
# pinned as tools in go.mod.
PROTO_DIR := internal/e2b/proto
proto:
	$(GO) build -o $(BIN)/protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go
	$(GO) build -o $(BIN)/protoc-gen-connect-go connectrpc.com/connect/cmd/protoc-gen-connect-go
	protoc -I $(PROTO_DIR) --plugin=$(BIN)/protoc-gen-go --plugin=$(BIN)/protoc-gen-connect-go \
		--go_out=. --go_opt=module=github.com/cubicle-dev/cubicle \
		--connect-go_out=. --connect-go_opt=module=github.com/cubicle-dev/cubicle \
		$(PROTO_DIR)/process/process.proto $(PROTO_DIR)/filesystem/filesystem.proto

run: build
	./scripts/dev.sh

clean:
	rm -rf $(BIN)
