package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Paragraph is one stanza of a Debian control-format file (a Packages
// index, a .deb's control file): field name to value, continuation lines
// kept with their newlines.
type Paragraph map[string]string

// parseParagraphs reads every stanza of a control-format stream. Field
// names are kept as written; Debian's are case-insensitive but its tools
// write them in one canonical case.
func parseParagraphs(r io.Reader) ([]Paragraph, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var out []Paragraph
	cur, last := Paragraph{}, ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			if len(cur) > 0 {
				out = append(out, cur)
			}
			cur, last = Paragraph{}, ""
		case line[0] == ' ' || line[0] == '\t':
			if last == "" {
				return nil, fmt.Errorf("control data: continuation line before any field: %q", line)
			}
			cur[last] += "\n" + line
		case line[0] == '#':
		default:
			name, value, ok := strings.Cut(line, ":")
			if !ok {
				return nil, fmt.Errorf("control data: not a field: %q", line)
			}
			last = name
			cur[name] = strings.TrimSpace(value)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out, nil
}

// depNames returns, for a Depends-style field, each dependency's
// alternatives as bare package names (version constraints and
// architecture qualifiers dropped: every package comes from one
// consistent index, so the newest version satisfies them).
func depNames(field string) [][]string {
	var out [][]string
	for _, dep := range strings.Split(field, ",") {
		var alts []string
		for _, alt := range strings.Split(dep, "|") {
			name := strings.TrimSpace(alt)
			if i := strings.IndexAny(name, " (["); i >= 0 {
				name = name[:i]
			}
			name, _, _ = strings.Cut(name, ":")
			if name != "" {
				alts = append(alts, name)
			}
		}
		if len(alts) > 0 {
			out = append(out, alts)
		}
	}
	return out
}

// compareVersions orders two Debian version strings as dpkg does
// (epoch, then upstream version, then revision). The lock picks the
// newest of a package across bookworm, bookworm-updates and
// bookworm-security, so a point release that folds in a security fix is
// compared correctly.
func compareVersions(a, b string) int {
	ea, ua, ra := splitVersion(a)
	eb, ub, rb := splitVersion(b)
	if c := compareNumeric(ea, eb); c != 0 {
		return c
	}
	if c := compareFragment(ua, ub); c != 0 {
		return c
	}
	return compareFragment(ra, rb)
}

func splitVersion(v string) (epoch, upstream, revision string) {
	epoch = "0"
	if e, rest, ok := strings.Cut(v, ":"); ok {
		epoch, v = e, rest
	}
	upstream = v
	if i := strings.LastIndex(v, "-"); i >= 0 {
		upstream, revision = v[:i], v[i+1:]
	}
	return epoch, upstream, revision
}

// compareFragment is dpkg's verrevcmp: alternating runs of non-digits
// (compared by charOrder) and digits (compared as numbers).
func compareFragment(a, b string) int {
	for a != "" || b != "" {
		for (a != "" && !isDigit(a[0])) || (b != "" && !isDigit(b[0])) {
			ca, cb := charOrder(a), charOrder(b)
			if ca != cb {
				return sign(ca - cb)
			}
			a, b = a[1:], b[1:]
		}
		na, nb := leadingDigits(a), leadingDigits(b)
		if c := compareNumeric(na, nb); c != 0 {
			return c
		}
		a, b = a[len(na):], b[len(nb):]
	}
	return 0
}

// charOrder ranks the first byte of s: '~' before the end of the string,
// the end before letters, letters before everything else.
func charOrder(s string) int {
	if s == "" || isDigit(s[0]) {
		return 0
	}
	c := s[0]
	switch {
	case c == '~':
		return -1
	case (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'):
		return int(c)
	default:
		return int(c) + 256
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func leadingDigits(s string) string {
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	return s[:i]
}

func compareNumeric(a, b string) int {
	a, b = strings.TrimLeft(a, "0"), strings.TrimLeft(b, "0")
	if len(a) != len(b) {
		return sign(len(a) - len(b))
	}
	return strings.Compare(a, b)
}

func sign(n int) int {
	switch {
	case n < 0:
		return -1
	case n > 0:
		return 1
	}
	return 0
}

// Source is one archive of the host's apt configuration: where a suite's
// files are and the keyring its InRelease is signed with.
type Source struct {
	URI     string
	Suite   string
	Keyring string
}

// readSources reads the "deb" entries for suites whose name starts with
// codename (bookworm, bookworm-updates, bookworm-security) and that carry
// the main component, from apt's deb822 .sources files and one-line
// .list files. The mirror is the machine's own: nothing here names one.
func readSources(files []string, codename string) ([]Source, error) {
	var out []Source
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var got []Source
		if strings.HasSuffix(f, ".sources") {
			got, err = deb822Sources(string(data), codename)
		} else {
			got = oneLineSources(string(data), codename)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out = append(out, got...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no apt source for %s main in %s; pass --sources with a deb822 file naming the mirror", codename, strings.Join(files, ", "))
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Suite < out[j].Suite })
	return out, nil
}

func deb822Sources(data, codename string) ([]Source, error) {
	ps, err := parseParagraphs(strings.NewReader(data))
	if err != nil {
		return nil, err
	}
	var out []Source
	for _, p := range ps {
		if !hasWord(p["Types"], "deb") || !hasWord(p["Components"], "main") || p["Enabled"] == "no" {
			continue
		}
		for _, uri := range strings.Fields(p["URIs"]) {
			for _, suite := range strings.Fields(p["Suites"]) {
				if matchSuite(suite, codename) {
					out = append(out, Source{URI: strings.TrimSuffix(uri, "/"), Suite: suite, Keyring: p["Signed-By"]})
				}
			}
		}
	}
	return out, nil
}

func oneLineSources(data, codename string) []Source {
	var out []Source
	for _, line := range strings.Split(data, "\n") {
		keyring := ""
		// Options, as in "deb [arch=amd64 signed-by=/k.gpg] URI suite main":
		// only the keyring matters here.
		if i, j := strings.Index(line, "["), strings.Index(line, "]"); i >= 0 && j > i {
			for _, o := range strings.Fields(line[i+1 : j]) {
				if v, ok := strings.CutPrefix(o, "signed-by="); ok {
					keyring = v
				}
			}
			line = line[:i] + line[j+1:]
		}
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] == "deb" && matchSuite(f[2], codename) && hasWord(strings.Join(f[3:], " "), "main") {
			out = append(out, Source{URI: strings.TrimSuffix(f[1], "/"), Suite: f[2], Keyring: keyring})
		}
	}
	return out
}

func matchSuite(suite, codename string) bool {
	return suite == codename || strings.HasPrefix(suite, codename+"-")
}

func hasWord(s, w string) bool {
	for _, f := range strings.Fields(s) {
		if f == w {
			return true
		}
	}
	return false
}

// defaultSourceFiles is apt's own configuration on this machine.
func defaultSourceFiles() []string {
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	list, _ := filepath.Glob("/etc/apt/sources.list.d/*.list")
	files = append(files, list...)
	if _, err := os.Stat("/etc/apt/sources.list"); err == nil {
		files = append(files, "/etc/apt/sources.list")
	}
	return files
}
