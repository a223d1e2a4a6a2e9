//go:build e2e

// Package ipsets reads the headers of the node's ipsets (`ipset list -t`:
// no entries, so cheap at any size) for the benchmarks.
package ipsets

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// Set is one set's header.
type Set struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Header  string `json:"header"`
	Entries int    `json:"entries"`
}

// List runs `ipset list -t` for the named sets (every set when none is
// named) and returns its output and the sets in it.
func List(names ...string) (string, []Set, error) {
	if len(names) > 1 {
		return "", nil, fmt.Errorf("ipsets.List: one set or all")
	}
	out, err := exec.Command("ipset", append([]string{"list", "-t"}, names...)...).CombinedOutput()
	if err != nil {
		return string(out), nil, fmt.Errorf("ipset list -t: %v: %s", err, out)
	}
	return string(out), Parse(string(out)), nil
}

// Entries is the number of entries of a set, -1 when it does not exist
// (yet).
func Entries(name string) int {
	_, sets, err := List(name)
	if err != nil {
		return -1
	}
	return Find(sets, name)
}

// Find is the number of entries of the set name among sets, -1 when it is
// not there.
func Find(sets []Set, name string) int {
	for _, s := range sets {
		if s.Name == name {
			return s.Entries
		}
	}
	return -1
}

// Parse reads the output of `ipset list -t`.
func Parse(out string) []Set {
	var sets []Set
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		if k == "Name" {
			sets = append(sets, Set{Name: v})
			continue
		}
		if len(sets) == 0 {
			continue
		}
		s := &sets[len(sets)-1]
		switch k {
		case "Type":
			s.Type = v
		case "Header":
			s.Header = v
		case "Number of entries":
			s.Entries, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return sets
}
