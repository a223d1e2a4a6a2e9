package nftrules

import (
	"bytes"
	"slices"
	"strings"
)

// This file prints a table as `nft list table inet ipvsproxy` does
// (nftables 1.0.x): tabs for indentation, sets before chains, a blank
// line between blocks, a set's elements sorted by key — except in an
// interval set, whose elements nft prints in the kernel's dump order.

// listTable renders sets (with elements[set name], in the kernel's dump
// order) and chains.
func listTable(name string, sets []*setSpec, elements map[string][]element, chains []chainSpec) string {
	var b strings.Builder
	b.WriteString("table inet " + name + " {\n")
	delim := ""
	for _, s := range sets {
		b.WriteString(delim)
		writeSet(&b, s, elements[s.name])
		delim = "\n"
	}
	for _, c := range chains {
		b.WriteString(delim)
		writeChain(&b, c)
		delim = "\n"
	}
	b.WriteString("}\n")
	return b.String()
}

func writeSet(b *strings.Builder, s *setSpec, elems []element) {
	b.WriteString("\tset " + s.name + " {\n")
	b.WriteString("\t\ttype " + s.typeName() + "\n")
	if s.interval() {
		b.WriteString("\t\tflags interval\n")
	}
	if len(elems) > 0 {
		if !s.interval() {
			elems = slices.SortedFunc(slices.Values(elems), func(x, y element) int { return bytes.Compare(x.key, y.key) })
		}
		b.WriteString("\t\telements = { ")
		perLine := s.elementsPerLine()
		for i, e := range elems {
			if i > 0 {
				if i%perLine == 0 {
					b.WriteString(",\n\t\t\t     ")
				} else {
					b.WriteString(", ")
				}
			}
			b.WriteString(e.text)
		}
		b.WriteString(" }\n")
	}
	b.WriteString("\t}\n")
}

// elementsPerLine is how many elements nft prints on one line: it breaks
// after every 2 IPv4 addresses, every 5 ports, and after every element
// of other types (IPv6 addresses, concatenations).
func (s *setSpec) elementsPerLine() int {
	switch {
	case s.concat() || s.v6 && s.key[0] != fieldPort:
		return 1
	case s.key[0] == fieldPort:
		return 5
	}
	return 2
}

func writeChain(b *strings.Builder, c chainSpec) {
	b.WriteString("\tchain " + c.name + " {\n")
	if c.hook != nil {
		b.WriteString("\t\t" + c.hook.text() + "\n")
	}
	for _, r := range c.rules {
		b.WriteString("\t\t" + r.text() + "\n")
	}
	b.WriteString("\t}\n")
}
