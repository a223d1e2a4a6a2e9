//go:build e2e

// Package framework is the e2e sandbox's toolbox: an API-server client,
// "pods" made of network namespaces, the ipvsproxy process, readers of the
// kernel state as operators see it (ipvsadm, ip, ipset) and traffic clients.
// Everything is built with the e2e tag so the product's module stays free
// of the test-only dependencies.
package framework

import (
	"errors"
	"fmt"
	"time"
)

type permanentError struct{ error }

func (p permanentError) Unwrap() error { return p.error }

// Permanent marks an error that waiting cannot cure (a process that
// exited): Eventually returns it at once instead of polling to the timeout.
func Permanent(err error) error { return permanentError{err} }

// Eventually calls f every interval until it returns nil or timeout passes;
// on timeout the error names how long it waited and f's last complaint, so a
// failing test says what the kernel still lacked rather than just "timeout".
func Eventually(timeout, interval time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	start := time.Now()
	for {
		err := f()
		if err == nil {
			return nil
		}
		var perm permanentError
		if errors.As(err, &perm) {
			return perm.error
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still failing after %v: %w", time.Since(start).Round(time.Millisecond), err)
		}
		time.Sleep(interval)
	}
}
