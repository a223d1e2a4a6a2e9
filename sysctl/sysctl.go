// Package sysctl reads and writes kernel parameters under /proc/sys.
package sysctl

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Interface reads and writes sysctls by their slash-separated name, e.g.
// "net/ipv4/vs/conntrack".
type Interface interface {
	Get(name string) (string, error)
	Set(name, value string) error
}

// Proc is the real implementation backed by /proc/sys.
type Proc struct{ Root string }

// New returns a Proc rooted at /proc/sys.
func New() *Proc { return &Proc{Root: "/proc/sys"} }

// Get returns the trimmed value of a sysctl.
func (p *Proc) Get(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(p.Root, name))
	if err != nil {
		return "", fmt.Errorf("sysctl %s: %w", name, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Set writes a sysctl.
func (p *Proc) Set(name, value string) error {
	if err := os.WriteFile(filepath.Join(p.Root, name), []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", name, value, err)
	}
	return nil
}

// Fake is an in-memory Interface for tests. A name that was never set reads
// as an error, like a missing /proc/sys file; ReadOnly names refuse writes.
type Fake struct {
	mu       sync.Mutex
	Values   map[string]string
	ReadOnly map[string]bool
}

// NewFake returns a Fake holding the given values.
func NewFake(values map[string]string) *Fake {
	f := &Fake{Values: map[string]string{}, ReadOnly: map[string]bool{}}
	for k, v := range values {
		f.Values[k] = v
	}
	return f
}

// Get implements Interface.
func (f *Fake) Get(name string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.Values[name]
	if !ok {
		return "", fmt.Errorf("sysctl %s: %w", name, os.ErrNotExist)
	}
	return v, nil
}

// Set implements Interface.
func (f *Fake) Set(name, value string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ReadOnly[name] {
		return fmt.Errorf("sysctl %s=%s: %w", name, value, os.ErrPermission)
	}
	f.Values[name] = value
	return nil
}
