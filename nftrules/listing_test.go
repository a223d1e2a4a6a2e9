package nftrules

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Element lists in `nft list` text, as writeSet prints them: the first
// line after elementsOpen, each wrapped line after elementsCont, the
// last one ending in elementsClose.
const (
	elementsOpen  = "\t\telements = { "
	elementsCont  = "\t\t\t     "
	elementsClose = " }"
)

// sortHashSetElements returns an `nft list table` listing with the
// elements of every set that is not `flags interval` sorted. nft prints
// a hash set's elements in the order the kernel's hash table dumps them,
// which depends on the kernel's hash seed, so no fake can predict it; the
// fake prints them sorted. An interval set's order is the kernel's
// pipapo/rbtree dump order, which the fake does model, so it is left
// as it is. Each list keeps its line shape (how many elements on each
// line), so nft's wrapping is still compared.
func sortHashSetElements(listing string) (string, error) {
	lines := strings.SplitAfter(listing, "\n")
	var out strings.Builder
	interval := false
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		switch {
		case strings.HasPrefix(line, "\tset "):
			interval = false
		case strings.HasPrefix(line, "\t\tflags ") && strings.Contains(line, "interval"):
			interval = true
		}
		if interval || !strings.HasPrefix(line, elementsOpen) {
			out.WriteString(line)
			continue
		}
		n, text, err := sortElementLines(lines[i:])
		if err != nil {
			return "", fmt.Errorf("line %d: %w", i+1, err)
		}
		out.WriteString(text)
		i += n - 1
	}
	return out.String(), nil
}

// sortElementLines takes the lines of one element list (and any after
// it) and returns how many lines the list has and the list re-rendered
// with its elements sorted, each line holding as many as before.
func sortElementLines(lines []string) (int, string, error) {
	var elems []string
	var perLine []int
	for n, line := range lines {
		body := strings.TrimSuffix(line, "\n")
		if n == 0 {
			body = strings.TrimPrefix(body, elementsOpen)
		} else if b, ok := strings.CutPrefix(body, elementsCont); ok {
			body = b
		} else {
			return 0, "", fmt.Errorf("element list broken by %q", body)
		}
		body, last := strings.CutSuffix(body, elementsClose)
		if !last {
			var ok bool
			if body, ok = strings.CutSuffix(body, ","); !ok {
				return 0, "", fmt.Errorf("wrapped element line without a trailing comma: %q", line)
			}
		}
		parts := strings.Split(body, ", ")
		elems = append(elems, parts...)
		perLine = append(perLine, len(parts))
		if last {
			slices.Sort(elems)
			return n + 1, renderElementLines(elems, perLine), nil
		}
	}
	return 0, "", fmt.Errorf("element list not closed")
}

func renderElementLines(elems []string, perLine []int) string {
	var b strings.Builder
	b.WriteString(elementsOpen)
	for i, n := range perLine {
		if i > 0 {
			b.WriteString(",\n" + elementsCont)
		}
		b.WriteString(strings.Join(elems[:n], ", "))
		elems = elems[n:]
	}
	b.WriteString(elementsClose + "\n")
	return b.String()
}

func TestSortHashSetElements(t *testing.T) {
	const fake = "table inet ipvsproxy {\n" +
		"\tset cluster-ip-v4 {\n" +
		"\t\ttype ipv4_addr . inet_proto . inet_service\n" +
		"\t\telements = { 10.96.0.1 . tcp . 443,\n" +
		"\t\t\t     10.96.0.10 . tcp . 53,\n" +
		"\t\t\t     10.96.0.10 . udp . 53 }\n" +
		"\t}\n\n" +
		"\tset node-port-v4 {\n" +
		"\t\ttype inet_service\n" +
		"\t\telements = { 30053, 30080 }\n" +
		"\t}\n\n" +
		"\tset load-balancer-source-cidr-v4 {\n" +
		"\t\ttype ipv4_addr . inet_proto . inet_service . ipv4_addr\n" +
		"\t\tflags interval\n" +
		"\t\telements = { 192.0.2.10 . tcp . 443 . 203.0.113.0/24,\n" +
		"\t\t\t     192.0.2.10 . tcp . 443 . 198.51.100.0/24 }\n" +
		"\t}\n" +
		"}\n"
	// swap exchanges two lines of fake's text.
	swap := func(a, b string) string {
		return strings.NewReplacer(a, b, b, a).Replace(fake)
	}
	for _, tc := range []struct {
		name, kernel string
		same         bool
	}{
		{"identical", fake, true},
		{"hash order", strings.Replace(swap("10.96.0.1 . tcp . 443", "10.96.0.10 . udp . 53"), "30053, 30080", "30080, 30053", 1), true},
		{"an element differs", strings.Replace(fake, "10.96.0.10 . udp . 53", "10.96.0.11 . udp . 53", 1), false},
		{"an element missing", strings.Replace(fake, "30053, 30080", "30080", 1), false},
		{"wrapped differently", strings.Replace(fake, "443,\n\t\t\t     10.96.0.10 . tcp . 53", "443, 10.96.0.10 . tcp . 53", 1), false},
		{"interval order", swap("203.0.113.0/24", "198.51.100.0/24"), false},
		{"elsewhere", strings.Replace(fake, "type inet_service", "type inet_proto", 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := sortHashSetElements(fake)
			if err != nil {
				t.Fatal(err)
			}
			b, err := sortHashSetElements(tc.kernel)
			if err != nil {
				t.Fatal(err)
			}
			if same := a == b; same != tc.same {
				t.Errorf("normalised listings equal: %v, want %v\n%s", same, tc.same, b)
			}
		})
	}
	for _, bad := range []string{
		"\t\telements = { 1, 2,\n",
		"\t\telements = { 1, 2,\n\t}\n",
		"\t\telements = { 1, 2\n\t\t\t     3 }\n",
	} {
		if _, err := sortHashSetElements(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
