// Package cleanup provides an undo stack for multi-step setup, so a failure
// half way through tears down exactly what was built, in reverse order.
package cleanup

import (
	"context"
	"errors"
)

// Stack holds undo functions. The zero value is ready to use. Run executes
// them last-pushed first unless Release was called.
type Stack struct {
	fns      []func(context.Context) error
	released bool
}

// Push adds an undo step.
func (s *Stack) Push(fn func(context.Context) error) { s.fns = append(s.fns, fn) }

// Release marks the setup as successful: Run becomes a no-op.
func (s *Stack) Release() { s.released = true }

// Run undoes every pushed step in reverse order (unless released) and joins
// their errors. It uses a context detached from ctx's cancellation, because
// cleanup must still happen when the request that started setup is gone.
func (s *Stack) Run(ctx context.Context) error {
	if s.released {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	var errs []error
	for i := len(s.fns) - 1; i >= 0; i-- {
		if err := s.fns[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	s.fns = nil
	return errors.Join(errs...)
}
