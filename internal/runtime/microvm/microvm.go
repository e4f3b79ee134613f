// Package microvm runs each sandbox in its own QEMU `microvm` virtual
// machine with a guest kernel of the project's own (make guest-kernel):
// untrusted code talks to that kernel, never the host's. KVM is used when a
// short boot probe shows it works here, else TCG (software emulation).
//
// The host prepares what it does for every driver — the rootfs overlay and
// the netns — and the VM sees them as follows: the rootfs is served over
// 9p (virtio-9p, QEMU's local backend, passthrough ownership, through an
// idmapped mount), so the upper dir on the host is the sandbox's disk
// exactly as for the other drivers (captures, diffs, quotas, persistence);
// bind mounts are further 9p shares; the network is a tap in the netns
// joined to the veth (see net.go); the agent is /init of a per-boot
// initramfs (see package guest) and is reached over TCP on the sandbox's
// address, like every agent. QEMU itself runs unprivileged in a jail of
// namespaces (see jail.go).
//
// Lock order: none; the driver keeps no in-memory state per sandbox. Its
// state is stateDir/<id>/ (state.json names QEMU's process and its id
// slot, see slots.go).
package microvm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cavaliergopher/cpio"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agent/vport"
	"github.com/cubicle-dev/cubicle/internal/atomicfile"
	"github.com/cubicle-dev/cubicle/internal/cleanup"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/microvm/guest"
	"github.com/cubicle-dev/cubicle/internal/runtime/userns"
)

// Name is the driver's --runtime name.
const Name = "microvm"

// Accelerators.
const (
	AccelKVM = "kvm"
	AccelTCG = "tcg"
)

// guestOverheadBytes is guest RAM beyond the sandbox's memory limit: the
// guest kernel's own use (about 20 MiB here) and its page cache, so the
// limit bounds what the workload gets and an over-limit process is
// OOM-killed inside a guest that lives on.
const guestOverheadBytes = 96 << 20

// defaultGuestBytes is the guest RAM of a sandbox without a memory limit.
// QEMU allocates guest pages on first touch, so it costs what is used.
const defaultGuestBytes = 2 << 30

// maxMounts is how many bind mounts a VM takes: without ACPI, QEMU's
// microvm machine has 8 virtio-mmio transports, and the entropy device,
// the NIC, the agent's serial port and the root share take four.
const maxMounts = 4

// Files in a sandbox's state dir.
const (
	stateFile   = "state.json"
	consoleDir  = "console" // a tmpfs of consoleBytes: see mountConsole
	consoleFile = "console/console.log"
	initrdFile  = "initrd.cpio"
	qemuLog     = "console/qemu.log" // QEMU's own messages, on the console's tmpfs
	qmpSocket   = "qmp.sock"
	agentSocket = "agent.sock" // the agent port's chardev: see DialAgent
)

// consoleBytes bounds the guest's serial console log. Root inside can
// reach the serial port (a devtmpfs of its own shows it), so the log sits
// on a tmpfs of this size: a guest that floods it fills that, not the
// host's disk (QEMU drops what does not fit).
const consoleBytes = 1 << 20

// Config configures New.
type Config struct {
	// QEMU is the qemu-system-x86_64 binary.
	QEMU string
	// Kernel is the guest kernel (an uncompressed vmlinux with a PVH
	// entry point).
	Kernel string
	// StateDir holds per-sandbox state.
	StateDir string
	// HostResolvConf is read for the sandboxes' nameservers.
	HostResolvConf string
	// Accel is AccelKVM, AccelTCG, or "" to probe: KVM when /dev/kvm boots
	// a guest within KVMProbeTimeout, else TCG.
	Accel string
	// Agent is the in-sandbox binary used by the KVM probe.
	Agent string
	// Jail is the binary re-executed as QEMU's jail: it must call Jail
	// when its first argument is JailArg. Default: /proc/self/exe.
	Jail string
}

// KVMProbeTimeout bounds the KVM probe's boot. A usable KVM boots the
// guest to init in well under a second; a host whose /dev/kvm is nested or
// emulated (PVM) takes far longer, and TCG is then the faster choice.
const KVMProbeTimeout = 5 * time.Second

// Driver implements runtime.Driver with QEMU microVMs.
type Driver struct {
	cfg   Config
	accel string

	mu    sync.Mutex
	ports map[string]*vport.Dialer // by sandbox id, from the first DialAgent until Stop
}

var (
	_ runtime.Driver      = (*Driver)(nil)
	_ runtime.Lister      = (*Driver)(nil)
	_ runtime.Prober      = (*Driver)(nil)
	_ runtime.Explainer   = (*Driver)(nil)
	_ runtime.AgentDialer = (*Driver)(nil)
)

// New checks cfg and decides the accelerator.
func New(ctx context.Context, cfg Config) (*Driver, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(cfg.Kernel); err != nil {
		return nil, fmt.Errorf("microvm: guest kernel (make guest-kernel): %w", err)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("microvm: state dir: %w", err)
	}
	d := &Driver{cfg: cfg, accel: cfg.Accel, ports: map[string]*vport.Dialer{}}
	switch cfg.Accel {
	case AccelKVM, AccelTCG:
	case "":
		d.accel = probeAccel(ctx, cfg)
	default:
		return nil, fmt.Errorf("microvm: accelerator %q: want kvm or tcg: %w", cfg.Accel, errdefs.ErrInvalid)
	}
	return d, nil
}

// withDefaults fills in cfg's unset QEMU, Jail and HostResolvConf and
// resolves QEMU to the path its jail shows.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.QEMU == "" {
		p, err := exec.LookPath("qemu-system-x86_64")
		if err != nil {
			return cfg, fmt.Errorf("microvm: qemu-system-x86_64 not found (apt-get install qemu-system-x86): %w", err)
		}
		cfg.QEMU = p
	}
	p, err := jailQEMU(cfg.QEMU)
	if err != nil {
		return cfg, err
	}
	cfg.QEMU = p
	if cfg.Jail == "" {
		cfg.Jail = "/proc/self/exe"
	}
	if cfg.HostResolvConf == "" {
		cfg.HostResolvConf = "/etc/resolv.conf"
	}
	return cfg, nil
}

// Name implements runtime.Driver.
var _ runtime.AgentIdentifier = (*Driver)(nil)

// AgentSetsIdentity implements runtime.AgentIdentifier: the agent is
// root of the guest's own kernel, CAP_SYS_ADMIN included, so a claimed
// warm-pool instance takes its record's hostname from one agent call.
func (d *Driver) AgentSetsIdentity() bool { return true }

func (d *Driver) Name() string { return Name }

// Accel is the accelerator the driver's VMs run on.
func (d *Driver) Accel() string { return d.accel }

// probeAccel boots the guest kernel under KVM with an initramfs whose init
// has no config (it says so on the console and powers off): KVM is used
// when that message comes within KVMProbeTimeout. QEMU runs in the jail a
// sandbox's does (see bootsUnder). The answer is kept in the
// state dir for this host boot, QEMU and kernel, so a restarted daemon
// does not wait for the probe again.
func probeAccel(ctx context.Context, cfg Config) string {
	cache := filepath.Join(cfg.StateDir, "accel-probe")
	key := probeKey(cfg)
	if b, err := os.ReadFile(cache); err == nil {
		if k, a, ok := strings.Cut(strings.TrimSpace(string(b)), " "); ok && k == key && (a == AccelKVM || a == AccelTCG) {
			return a
		}
	}
	accel := AccelTCG
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil && cfg.Agent != "" {
		f.Close()
		if bootsUnder(ctx, cfg, AccelKVM, KVMProbeTimeout) {
			accel = AccelKVM
		}
	}
	atomicfile.WriteFile(cache, []byte(key+" "+accel+"\n"), 0o600)
	return accel
}

// probeKey names what a probe's answer depends on: the host boot and the
// QEMU and kernel files.
func probeKey(cfg Config) string {
	h := sha256.New()
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	h.Write(boot)
	for _, p := range []string{cfg.QEMU, cfg.Kernel} {
		if fi, err := os.Stat(p); err == nil {
			fmt.Fprintf(h, "%s %d %d\n", p, fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// ProbeAccel is the accelerator New would choose for cfg with Accel unset
// (TCG when cfg is unusable).
func ProbeAccel(ctx context.Context, cfg Config) string {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return AccelTCG
	}
	return probeAccel(ctx, cfg)
}

// bootsUnder reports whether the guest kernel boots to init under accel
// within timeout: init's complaint about its missing config reaches the
// console (it then powers off, which halts a guest without ACPI, so QEMU
// is killed here). QEMU runs jailed as a sandbox's does, with an id slot
// of its own (owned by its temporary dir's name) and no network or
// exports; its -name is that dir.
func bootsUnder(ctx context.Context, cfg Config, accel string, timeout time.Duration) bool {
	dir, err := os.MkdirTemp(cfg.StateDir, "probe-")
	if err != nil {
		return false
	}
	defer os.RemoveAll(dir)
	slot, err := allocSlot(cfg.StateDir, filepath.Base(dir))
	if err != nil {
		return false
	}
	defer releaseSlots(cfg.StateDir, filepath.Base(dir))
	hostID := slotHostID(slot)
	initrd := filepath.Join(dir, initrdFile)
	if err := writeInitrd(initrd, cfg.Agent, nil); err != nil {
		return false
	}
	console := filepath.Join(dir, "console.log")
	if err := os.WriteFile(console, nil, 0o600); err != nil {
		return false
	}
	for _, p := range []string{initrd, console} {
		if err := os.Chown(p, hostID, hostID); err != nil {
			return false
		}
	}
	var j jailFiles
	defer j.close()
	if err := j.systemFiles(accel == AccelKVM); err != nil {
		return false
	}
	var fds []int
	for _, f := range []struct {
		path string
		flag int
	}{{cfg.Kernel, os.O_RDONLY}, {initrd, os.O_RDONLY}, {console, os.O_WRONLY | os.O_APPEND}} {
		fh, err := os.OpenFile(f.path, f.flag, 0)
		if err != nil {
			return false
		}
		fds = append(fds, j.add(fh))
	}
	argv := append([]string{cfg.QEMU}, machineArgs(accel, 1, 256<<20)...)
	argv = append(argv, "-name", "guest="+dir,
		"-kernel", fdPath(fds[0]), "-initrd", fdPath(fds[1]),
		"-append", "console=ttyS0 quiet panic=-1 rdinit=/init", "-serial", "file:"+fdPath(fds[2]),
		"-sandbox", qemuSandbox)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, cfg.Jail, JailArg)
	if err := startJail(cmd, hostID, accel == AccelKVM, &j, argv); err != nil {
		return false
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() { cancel(); <-exited }()
	for {
		if b, _ := os.ReadFile(console); bytes.Contains(b, []byte("cubicle guest init")) {
			return true
		}
		select {
		case <-exited:
			return false
		case <-ctx.Done():
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// machineArgs are the QEMU arguments for the machine itself.
func machineArgs(accel string, vcpus int, memBytes int64) []string {
	cpu, acc := "max", accel
	if accel == AccelKVM {
		cpu = "host"
	} else {
		// TCG's translated-code cache defaults to 1 GiB and fills with
		// what the guest ran; an agent and shells need a fraction.
		acc += ",tb-size=64"
	}
	return []string{
		"-machine", "microvm,acpi=off,x-option-roms=off,rtc=off,isa-serial=on",
		"-accel", acc, "-cpu", cpu,
		"-smp", strconv.Itoa(vcpus), "-m", strconv.FormatInt(memBytes>>20, 10) + "M",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-device", "virtio-rng-device",
	}
}

func (d *Driver) dir(id string) string { return filepath.Join(d.cfg.StateDir, id) }

// state is stateDir/<id>/state.json, written once QEMU runs.
type state struct {
	runtime.Process
	NetNS string `json:"netns"`
	Link  string `json:"link"`
	// Slot is QEMU's id slot (see slots.go).
	Slot int `json:"slot"`
}

func validID(id string) error {
	if !runtime.IDPattern.MatchString(id) {
		return fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalid)
	}
	return nil
}

// Start implements runtime.Driver: it writes the sandbox's network files
// and initramfs, creates the tap in the netns, starts QEMU in its jail and
// joins the tap to the veth. It returns once QEMU runs; the caller waits for the agent.
func (d *Driver) Start(ctx context.Context, spec runtime.Spec) error {
	if err := runtime.ValidateSpec(spec); err != nil {
		return err
	}
	if spec.Docker {
		return fmt.Errorf("start %s: Docker inside is not offered on the microvm runtime yet: %w", spec.ID, errdefs.ErrInvalid)
	}
	if len(spec.Mounts) > maxMounts {
		return fmt.Errorf("start %s: %d mounts, the microvm runtime takes at most %d: %w", spec.ID, len(spec.Mounts), maxMounts, errdefs.ErrInvalid)
	}
	if ok, err := d.Running(ctx, spec.ID); err != nil || ok {
		if err == nil {
			err = errdefs.ErrConflict
		}
		return fmt.Errorf("start %s: already running: %w", spec.ID, err)
	}
	if err := d.Stop(ctx, spec.ID); err != nil { // a dead instance's leftovers
		return err
	}
	var undo cleanup.Stack
	defer undo.Run(ctx)
	dir := d.dir(spec.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	undo.Push(func(context.Context) error { return os.RemoveAll(dir) })
	slot, err := allocSlot(d.cfg.StateDir, spec.ID)
	if err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	undo.Push(func(context.Context) error { return releaseSlots(d.cfg.StateDir, spec.ID) })
	hostID := slotHostID(slot)
	if err := mountConsole(dir); err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	undo.Push(func(context.Context) error { return unmountConsole(dir) })

	resolv, err := runtime.ResolvConf(d.cfg.HostResolvConf)
	if err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	if err := runtime.WriteNetFiles(ctx, spec.RootFS, spec.Hostname, resolv); err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	n, err := readNet(spec.NetNS)
	if err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	gcfg := guest.Config{
		Hostname: spec.Hostname, Env: spec.Env, Token: spec.Token,
		MemBytes: spec.Limits.MemBytes, Tasks: spec.Limits.Tasks(), ShmBytes: spec.Limits.TmpfsBytes(),
		HostTimeNanos: time.Now().UnixNano(),
	}
	for _, m := range spec.Mounts {
		gcfg.Mounts = append(gcfg.Mounts, guest.Mount{Target: m.Target, ReadOnly: m.ReadOnly})
	}
	initrd := filepath.Join(dir, initrdFile)
	if err := writeInitrd(initrd, spec.AgentBinary, &gcfg); err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	// QEMU reopens these through the fds it is handed, as its own uid.
	for _, p := range []string{initrd, filepath.Join(dir, consoleFile)} {
		if err := os.Chown(p, hostID, hostID); err != nil {
			return fmt.Errorf("start %s: %w", spec.ID, err)
		}
	}
	// The initramfs holds the token: it goes as soon as QEMU has loaded it.
	defer os.Remove(initrd)

	undo.Push(func(ctx context.Context) error { return disconnect(spec.NetNS, n.Link) })
	proc, err := d.launch(ctx, spec, n, dir, hostID)
	if err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	undo.Push(func(ctx context.Context) error { return proc.Kill(ctx) })
	if err := d.writeState(spec.ID, state{Process: proc, NetNS: spec.NetNS, Link: n.Link, Slot: slot}); err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	if err := connectTap(spec.NetNS, n); err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	undo.Release()
	return nil
}

// vcpus is the guest's CPU count: the limit rounded up, else every CPU the
// daemon may use.
func vcpus(l runtime.Limits) int {
	if l.MilliCPUs > 0 {
		return int((l.MilliCPUs + 999) / 1000)
	}
	if cpus, err := runtime.AllowedCPUs(); err == nil && len(cpus) > 0 {
		return len(cpus)
	}
	return 1
}

// guestBytes is the guest's RAM for limits l.
func guestBytes(l runtime.Limits) int64 {
	if l.MemBytes > 0 {
		return l.MemBytes + guestOverheadBytes
	}
	return defaultGuestBytes
}

// qemuReadyTimeout bounds QEMU's own setup (devices, the QMP socket);
// the guest's boot is the caller's to wait for.
const qemuReadyTimeout = 30 * time.Second

// launch starts QEMU in its jail (see jail.go) as host id hostID and
// returns once it has set up the machine (QMP answers), with the guest
// booting.
//
// QEMU runs in a session of its own (no signal to the daemon's group
// reaches it); its seccomp filter refuses exec, privilege changes and
// obsolete syscalls. It is deliberately not a child the daemon must
// outlive: the daemon reaps it while it lives, the host's init afterwards.
func (d *Driver) launch(ctx context.Context, spec runtime.Spec, n guestNet, dir string, hostID int) (runtime.Process, error) {
	// The exports are idmapped with a namespace of QEMU's own mapping;
	// the mounts keep it alive.
	usernsFD, err := userns.New([]string{d.cfg.Jail, JailArg}, hostID)
	if err != nil {
		return runtime.Process{}, fmt.Errorf("idmapping user namespace: %w", err)
	}
	defer unix.Close(usernsFD)
	var j jailFiles
	defer j.close()
	if err := j.systemFiles(d.accel == AccelKVM); err != nil {
		return runtime.Process{}, fmt.Errorf("qemu jail: %w", err)
	}
	root, mounts, err := j.exports(spec, usernsFD, hostID)
	if err != nil {
		return runtime.Process{}, fmt.Errorf("qemu jail: %w", err)
	}
	// Each file is the jail's as soon as it is open, so j.close closes it.
	kernel, err := os.Open(d.cfg.Kernel)
	if err != nil {
		return runtime.Process{}, fmt.Errorf("guest kernel: %w", err)
	}
	kernelFD := j.add(kernel)
	initrd, err := os.Open(filepath.Join(dir, initrdFile))
	if err != nil {
		return runtime.Process{}, fmt.Errorf("initramfs: %w", err)
	}
	initrdFD := j.add(initrd)
	console, err := os.OpenFile(filepath.Join(dir, consoleFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return runtime.Process{}, fmt.Errorf("console log: %w", err)
	}
	consoleFD := j.add(console)
	qmp, err := listenUnix(dir, qmpSocket)
	if err != nil {
		return runtime.Process{}, err
	}
	qmpFD := j.add(qmp)
	port, err := listenUnix(dir, agentSocket)
	if err != nil {
		return runtime.Process{}, err
	}
	portFD := j.add(port)
	var tap *os.File
	if err := inNetNS(spec.NetNS, func() (err error) { tap, err = openTap(); return err }); err != nil {
		return runtime.Process{}, err
	}
	tapFD := j.add(tap)

	args := machineArgs(d.accel, vcpus(spec.Limits), guestBytes(spec.Limits))
	args = append(args,
		// The state dir in the name is how Stop finds a QEMU whose state
		// file is gone (see unrecorded).
		"-name", "guest="+dir,
		"-kernel", fdPath(kernelFD), "-initrd", fdPath(initrdFD),
		"-append", "console=ttyS0 quiet panic=-1 rdinit=/init "+n.kernelArg(spec.Hostname),
		"-serial", "file:"+fdPath(consoleFD),
		"-netdev", "tap,id=net0,fd="+strconv.Itoa(tapFD),
		"-device", "virtio-net-device,netdev=net0,mac="+n.MAC.String(),
		"-fsdev", "local,id=root,path="+root+",security_model=passthrough,multidevs=remap",
		"-device", "virtio-9p-device,fsdev=root,mount_tag="+guest.RootTag,
	)
	for i, m := range spec.Mounts {
		id := guest.MountTag(i)
		fs := "local,id=" + id + ",path=" + mounts[i] + ",security_model=passthrough,multidevs=remap"
		if m.ReadOnly {
			fs += ",readonly=on"
		}
		args = append(args, "-fsdev", fs, "-device", "virtio-9p-device,fsdev="+id+",mount_tag="+id)
	}
	args = append(args,
		// The agent's API: a virtio-serial port whose host end is
		// agentSocket (guest.AgentPortName inside).
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,server=on,wait=off,fd="+strconv.Itoa(portFD),
		"-device", "virtserialport,chardev=agent,name="+guest.AgentPortName,
		"-chardev", "socket,id=qmp,server=on,wait=off,fd="+strconv.Itoa(qmpFD),
		"-mon", "chardev=qmp,mode=control",
		"-sandbox", qemuSandbox,
	)
	logf, err := os.OpenFile(filepath.Join(dir, qemuLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return runtime.Process{}, fmt.Errorf("qemu log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(d.cfg.Jail, JailArg)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Once started, QEMU holds the fds: a QEMU that dies closes the QMP
	// socket, and the wait below sees it.
	if err := startJail(cmd, hostID, d.accel == AccelKVM, &j, append([]string{d.cfg.QEMU}, args...)); err != nil {
		return runtime.Process{}, err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	proc, err := runtime.ProcessOf(cmd.Process.Pid)
	if err != nil {
		cmd.Process.Kill()
		return runtime.Process{}, err
	}
	// QMP answers from QEMU's main loop, which runs once the machine is
	// built: the kernel and initramfs are in guest memory by then.
	ctx, cancel := context.WithTimeout(ctx, qemuReadyTimeout)
	defer cancel()
	for {
		if _, err := d.qmpRun(ctx, spec.ID, "query-status", nil); err == nil {
			return proc, nil
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(dir, qemuLog))
			return runtime.Process{}, fmt.Errorf("qemu exited during setup: %s", strings.TrimSpace(string(b)))
		case <-ctx.Done():
			proc.Kill(context.WithoutCancel(ctx))
			return runtime.Process{}, fmt.Errorf("qemu setup: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// qemuSandbox is QEMU's -sandbox option: its seccomp filter.
const qemuSandbox = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// startJail starts cmd (the jail binary with JailArg, its output set) as
// QEMU's jail with j's fds and sends it argv, QEMU's command. The fds are
// closed here: QEMU holds them once it runs. On error, nothing runs.
func startJail(cmd *exec.Cmd, hostID int, kvm bool, j *jailFiles, argv []string) error {
	defer j.close()
	cfg, err := json.Marshal(jailConfig{Mounts: j.mounts, Symlinks: j.symlinks, Argv: argv})
	if err != nil {
		return err
	}
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer cfgR.Close()
	defer cfgW.Close()
	cmd.Env = []string{}
	cmd.ExtraFiles = append([]*os.File{cfgR}, j.files...)
	cmd.SysProcAttr = jailAttr(hostID, kvm)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start qemu jail: %w", err)
	}
	cfgR.Close()
	if _, err := cfgW.Write(cfg); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return fmt.Errorf("send jail config: %w", err)
	}
	return nil
}

// jailAttr starts the jail as root of a new user namespace with the
// sandbox id mapping at hostID (no supplementary groups) in new mount,
// pid, IPC, UTS, cgroup and network namespaces. On KVM, the group of
// /dev/kvm is mapped too (to an id past the sandbox's range) and kept as
// QEMU's one supplementary group, so it may open the device.
func jailAttr(hostID int, kvm bool) *syscall.SysProcAttr {
	gids := userns.IDMap(hostID)
	cred := &syscall.Credential{Uid: 0, Gid: 0}
	if fi, err := os.Stat("/dev/kvm"); err == nil && kvm {
		if g := fi.Sys().(*syscall.Stat_t).Gid; g != 0 && fi.Mode().Perm()&0o060 == 0o060 {
			gids = append(gids, syscall.SysProcIDMap{ContainerID: userns.IDMapSize, HostID: int(g), Size: 1})
			cred.Groups = []uint32{userns.IDMapSize}
		}
	}
	return &syscall.SysProcAttr{
		Setsid: true,
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC |
			syscall.CLONE_NEWUTS | syscall.CLONE_NEWCGROUP | syscall.CLONE_NEWNET,
		UidMappings: userns.IDMap(hostID),
		GidMappings: gids,
		// setgroups must be allowed to clear the daemon's groups (root's
		// among them): they would stay otherwise.
		GidMappingsEnableSetgroups: true,
		Credential:                 cred,
	}
}

// atSocket calls fn with an address of the unix socket name in dir
// that fits a socket address: dir's full path may not (108 bytes), so the
// address goes through /proc/self/fd of dir, open while fn runs.
func atSocket(dir, name string, fn func(addr string) error) error {
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket %s: %w", name, err)
	}
	defer unix.Close(dfd)
	return fn(filepath.Join("/proc/self/fd", strconv.Itoa(dfd), name))
}

// listenUnix binds and listens on the socket name in dir, for QEMU to
// accept on: QEMU never names a path of the host.
func listenUnix(dir, name string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	err = atSocket(dir, name, func(addr string) error {
		if err := unix.Bind(fd, &unix.SockaddrUnix{Name: addr}); err != nil {
			return fmt.Errorf("bind socket %s: %w", name, err)
		}
		return nil
	})
	if err == nil {
		if err = unix.Listen(fd, 4); err != nil {
			err = fmt.Errorf("listen on socket %s: %w", name, err)
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// dialUnix connects to the socket name in id's state dir.
func (d *Driver) dialUnix(ctx context.Context, id, name string) (c net.Conn, err error) {
	err = atSocket(d.dir(id), name, func(addr string) (err error) {
		var nd net.Dialer
		c, err = nd.DialContext(ctx, "unix", addr)
		return err
	})
	return c, err
}

// DialAgent implements runtime.AgentDialer: a stream of the session over
// the VM's agent port, which each sandbox keeps until Stop. The agent
// listens on no network address, so nothing of the sandbox's network (its
// own processes included) can reach its API.
func (d *Driver) DialAgent(ctx context.Context, id string) (net.Conn, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	d.mu.Lock()
	p := d.ports[id]
	if p == nil {
		p = vport.NewDialer(func(ctx context.Context) (net.Conn, error) { return d.dialUnix(ctx, id, agentSocket) })
		d.ports[id] = p
	}
	d.mu.Unlock()
	return p.Dial(ctx)
}

// closePort ends id's agent session, if it has one.
func (d *Driver) closePort(id string) {
	d.mu.Lock()
	p := d.ports[id]
	delete(d.ports, id)
	d.mu.Unlock()
	if p != nil {
		p.Close()
	}
}

// mountConsole mounts the console log's tmpfs in dir and creates the log.
func mountConsole(dir string) error {
	p := filepath.Join(dir, consoleDir)
	if err := os.Mkdir(p, 0o700); err != nil {
		return fmt.Errorf("console dir: %w", err)
	}
	if err := unix.Mount("tmpfs", p, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, fmt.Sprintf("mode=0700,size=%d", consoleBytes)); err != nil {
		return fmt.Errorf("console tmpfs: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, consoleFile), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("console log: %w", err)
	}
	return f.Close()
}

// unmountConsole undoes mountConsole; a dir without it is fine.
func unmountConsole(dir string) error {
	err := unix.Unmount(filepath.Join(dir, consoleDir), unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount console: %w", err)
	}
	return nil
}

// writeInitrd writes the initramfs: agent as /init, and cfg (when set) at
// guest.ConfigPath.
func writeInitrd(path, agent string, cfg *guest.Config) (err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			err = fmt.Errorf("initramfs: %w", err)
		}
	}()
	bin, err := os.Open(agent)
	if err != nil {
		return err
	}
	defer bin.Close()
	fi, err := bin.Stat()
	if err != nil {
		return err
	}
	w := cpio.NewWriter(f)
	if err := w.WriteHeader(&cpio.Header{Name: "init", Mode: cpio.TypeReg | 0o755, Size: fi.Size()}); err != nil {
		return err
	}
	if _, err := io.Copy(w, bin); err != nil {
		return err
	}
	if cfg != nil {
		data, err := json.Marshal(cfg)
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(guest.ConfigPath, "/")
		if err := w.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeReg | 0o600, Size: int64(len(data))}); err != nil {
			return err
		}
		if _, err := w.Write(data); err != nil {
			return err
		}
	}
	return w.Close()
}

func (d *Driver) readState(id string) (state, bool, error) {
	var st state
	b, err := os.ReadFile(filepath.Join(d.dir(id), stateFile))
	if errors.Is(err, os.ErrNotExist) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("read state of %s: %w", id, err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, false, fmt.Errorf("parse state of %s: %w", id, err)
	}
	return st, true, nil
}

func (d *Driver) writeState(id string, st state) error {
	b, _ := json.Marshal(st)
	if err := atomicfile.WriteFile(filepath.Join(d.dir(id), stateFile), b, 0o600); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	return nil
}

// Running implements runtime.Driver.
func (d *Driver) Running(ctx context.Context, id string) (bool, error) {
	pid, err := d.PID(ctx, id)
	return pid != 0, err
}

// PID implements runtime.Driver: QEMU's process while it lives.
func (d *Driver) PID(ctx context.Context, id string) (int, error) {
	if err := validID(id); err != nil {
		return 0, err
	}
	st, ok, err := d.readState(id)
	if err != nil || !ok || !st.Alive() {
		return 0, err
	}
	return st.PID, nil
}

// Stop implements runtime.Driver: it kills QEMU (the guest and everything
// in it go with it), undoes the tap redirect, frees QEMU's id slot and
// removes the state. Idempotent.
func (d *Driver) Stop(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	d.closePort(id)
	if _, err := os.Stat(d.dir(id)); errors.Is(err, os.ErrNotExist) {
		// Never launched here (every Start clears first), or stopped
		// after its slot was taken.
		return releaseSlots(d.cfg.StateDir, id)
	}
	st, ok, err := d.readState(id)
	if err != nil {
		return err
	}
	if ok {
		if err := st.Kill(ctx); err != nil {
			return fmt.Errorf("stop sandbox %s: %w", id, err)
		}
		if err := disconnect(st.NetNS, st.Link); err != nil {
			return fmt.Errorf("stop sandbox %s: %w", id, err)
		}
	} else if p, found := d.unrecorded(id); found {
		// A QEMU whose state was lost (a crash between launch and
		// writing it, a removed state dir) is still found by its files.
		if err := p.Kill(ctx); err != nil {
			return fmt.Errorf("stop sandbox %s: %w", id, err)
		}
	}
	if err := unmountConsole(d.dir(id)); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", id, err)
	}
	if err := os.RemoveAll(d.dir(id)); err != nil {
		return fmt.Errorf("stop sandbox %s: remove state: %w", id, err)
	}
	if err := releaseSlots(d.cfg.StateDir, id); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", id, err)
	}
	return nil
}

// unrecorded finds a QEMU running for id by its command line (its -name is
// id's state dir).
func (d *Driver) unrecorded(id string) (runtime.Process, bool) {
	for _, pid := range qemusWith(d.cfg.QEMU, []byte("\x00guest="+d.dir(id)+"\x00")) {
		if p, err := runtime.ProcessOf(pid); err == nil {
			return p, true
		}
	}
	return runtime.Process{}, false
}

// qemusWith lists the host processes running the QEMU binary qemu whose
// command line contains mark.
func qemusWith(qemu string, mark []byte) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(b, mark) && bytes.HasPrefix(b, []byte(qemu+"\x00")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// List implements runtime.Lister.
func (d *Driver) List(context.Context) ([]string, error) {
	return runtime.ListStateDirs(d.cfg.StateDir, runtime.IDPattern)
}

// Probe implements runtime.Prober: QEMU and the kernel are still there and
// the state dir is writable.
func (d *Driver) Probe(context.Context) error {
	for _, p := range []string{d.cfg.QEMU, d.cfg.Kernel} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("microvm: %w", err)
		}
	}
	f, err := os.CreateTemp(d.cfg.StateDir, ".probe-")
	if err != nil {
		return fmt.Errorf("microvm: state dir not writable: %w", err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// ExitCause implements runtime.Explainer from the guest's console: a
// kernel panic, an init failure or the OOM killer's last word.
func (d *Driver) ExitCause(id string) string {
	b, err := os.ReadFile(filepath.Join(d.dir(id), consoleFile))
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		for _, k := range []string{"Kernel panic", "cubicle guest init:", "Out of memory"} {
			if j := strings.Index(l, k); j >= 0 {
				return "guest: " + l[j:]
			}
		}
	}
	return ""
}

// KernelFile is the guest kernel's file name beside the cubicle binary
// (make guest-kernel puts it in bin/).
const KernelFile = "vmlinux"

// FindKernel returns explicit if set, else $CUBICLE_GUEST_KERNEL, else
// KernelFile beside the running executable.
func FindKernel(explicit string) (string, error) {
	p := explicit
	if p == "" {
		p = os.Getenv("CUBICLE_GUEST_KERNEL")
	}
	if p == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("microvm: find guest kernel: %w", err)
		}
		p = filepath.Join(filepath.Dir(exe), KernelFile)
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("microvm: guest kernel (build it with make guest-kernel): %w", err)
	}
	return p, nil
}
