package microvm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/digitalocean/go-qemu/qmp"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

var _ runtime.Pauser = (*Driver)(nil)

// qmpTimeout bounds connecting to a VM's QMP socket.
const qmpTimeout = 10 * time.Second

// qmpRun runs one QMP command on sandbox id's QEMU and returns its
// "return" value.
func (d *Driver) qmpRun(ctx context.Context, id, command string, args any) (json.RawMessage, error) {
	var mon *qmp.SocketMonitor
	err := atSocket(d.dir(id), qmpSocket, func(addr string) (err error) {
		if mon, err = qmp.NewSocketMonitor("unix", addr, qmpTimeout); err != nil {
			return err
		}
		return mon.Connect()
	})
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	}
	defer mon.Disconnect()
	req, err := json.Marshal(qmp.Command{Execute: command, Args: args})
	if err != nil {
		return nil, err
	}
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := mon.Run(req)
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, fmt.Errorf("qmp %s: %w", command, r.err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
		}
		if err := json.Unmarshal(r.out, &resp); err != nil {
			return nil, fmt.Errorf("qmp %s: %w", command, err)
		}
		return resp.Return, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("qmp %s: %w", command, ctx.Err())
	}
}

// Pause implements runtime.Pauser: the VM's vCPUs stop, so nothing in the
// guest runs or writes; QEMU finishes the 9p requests it has in hand.
func (d *Driver) Pause(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	if _, err := d.qmpRun(ctx, id, "stop", nil); err != nil {
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	return nil
}

// Resume implements runtime.Pauser.
func (d *Driver) Resume(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(d.dir(id), stateFile)); err != nil {
		return nil // not running: nothing is paused
	}
	if _, err := d.qmpRun(ctx, id, "cont", nil); err != nil {
		return fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	return nil
}
