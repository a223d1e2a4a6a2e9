//go:build e2e

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Samples are split into the guest kernel (named from kallsyms, modules
// with their tag), guest programs and the host kernel, and each
// function's share is printed.
func TestReportNamesGuestKernelFunctions(t *testing.T) {
	dir := t.TempDir()
	ks := filepath.Join(dir, "kallsyms")
	err := os.WriteFile(ks, []byte(strings.Join([]string{
		"0000000060000000 T _stext",
		"0000000060001000 T do_syscall",
		"0000000060002000 t nf_tables_commit\t[nf_tables]",
		"0000000060003000 D some_data",
		"0000000060004000 T nft_rhash_insert\t[nf_tables]",
	}, "\n")+"\n"), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	st, err := readKallsyms(ks)
	if err != nil {
		t.Fatal(err)
	}
	p := newProfile(st, nil, "/cache/uml/linux")
	// 1764823000 is 04:36:40 UTC; the window keeps 04:36:41 to 04:36:42.
	if p.win, err = parseWindow("04:36:41", "04:36:42.5"); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"100 1764823001.000001: 60002010 [unknown] (/cache/uml/linux)",
		"100 1764823001.1: 60002fff [unknown] ([unknown])",
		"100 1764823001.2: 60003800 [unknown] ([unknown])", // data symbols are skipped: still nf_tables_commit
		"100 1764823001.3: 60004010 [unknown] ([unknown])",
		"100 1764823001.4: 60001004 [unknown] (/cache/uml/linux)",
		"200 1764823001.5: ffffffff813ae493 finish_task_switch.isra.0 ([kernel.kallsyms])",
		"200 1764823002.4: 4a2b10 [unknown] ([unknown])",
		"100 1764823000.9: 60001004 [unknown] (/cache/uml/linux)", // before the window
		"100 1764823002.6: 60001004 [unknown] (/cache/uml/linux)", // after it
		"garbage",
	} {
		p.add(line)
	}
	var out strings.Builder
	p.write(&out, 10)
	got := out.String()
	for _, want := range []string{
		"7 samples",
		" 71.4%  guest kernel",
		" 14.3%  guest programs",
		" 14.3%  host kernel",
		" 42.9%  nf_tables_commit [nf_tables]",
		" 14.3%  nft_rhash_insert [nf_tables]",
		" 14.3%  do_syscall",
		" 14.3%  [unknown]",
		" 14.3%  finish_task_switch.isra.0",
		" 71.4%  pid 100 (71.4 / 0.0 / 0.0)",
		" 28.6%  pid 200 (0.0 / 14.3 / 14.3)  [unknown]",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}
