package iptables

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// call records one process run by a fake runFunc.
type call struct {
	bin   string
	args  string
	stdin string
}

// scripted returns a runFunc answering by binary+args and recording calls.
func scripted(answers map[string]string, fail map[string]string, calls *[]call) runFunc {
	return func(_ context.Context, bin string, args []string, stdin []byte) ([]byte, []byte, error) {
		key := strings.TrimSpace(bin + " " + strings.Join(args, " "))
		*calls = append(*calls, call{bin, strings.Join(args, " "), string(stdin)})
		if msg, ok := fail[key]; ok {
			return nil, []byte(msg), errors.New("exit status 2")
		}
		if out, ok := answers[key]; ok {
			return []byte(out), nil, nil
		}
		return nil, []byte("not found"), errors.New("exec: not found")
	}
}

func TestExecRunnerCommands(t *testing.T) {
	var calls []call
	r := &ExecRunner{family: IPv6, backend: BackendNFT, Timeout: time.Second, run: scripted(map[string]string{
		"ip6tables-nft-restore --version":                 "ip6tables-restore v1.8.9 (nf_tables)\n",
		"ip6tables-nft-save -t nat":                       "*nat\nCOMMIT\n",
		"ip6tables-nft-restore -w 5 --noflush --counters": "",
	}, nil, &calls)}
	if out, err := r.Save(TableNAT); err != nil || string(out) != "*nat\nCOMMIT\n" {
		t.Errorf("Save = %q, %v", out, err)
	}
	if err := r.Restore([]byte("*nat\nCOMMIT\n")); err != nil {
		t.Error(err)
	}
	if !r.HasRandomFully() {
		t.Error("1.8.9 supports --random-fully")
	}
	if _, err := r.Save("bogus"); err == nil {
		t.Error("Save accepted an unknown table")
	}
	// The version is probed once, before the first restore.
	want := []call{
		{"ip6tables-nft-save", "-t nat", ""},
		{"ip6tables-nft-restore", "--version", ""},
		{"ip6tables-nft-restore", "-w 5 --noflush --counters", "*nat\nCOMMIT\n"},
	}
	if len(calls) != len(want) {
		t.Fatalf("calls = %+v", calls)
	}
	for i := range want {
		if calls[i] != want[i] {
			t.Errorf("call %d = %+v, want %+v", i, calls[i], want[i])
		}
	}
}

func TestExecRunnerOldIptablesHasNoWait(t *testing.T) {
	var calls []call
	r := &ExecRunner{family: IPv4, backend: BackendLegacy, run: scripted(map[string]string{
		"iptables-legacy-restore --version":            "iptables-restore v1.6.1\n",
		"iptables-legacy-restore --noflush --counters": "",
	}, nil, &calls)}
	if err := r.Restore(nil); err != nil {
		t.Fatal(err)
	}
	if r.HasRandomFully() {
		t.Error("1.6.1 has no --random-fully")
	}
}

func TestExecRunnerErrorIsOneLine(t *testing.T) {
	var calls []call
	stderr := "iptables-restore v1.8.9 (legacy): Couldn't load target `NOPE':No such file or directory\n\n" +
		"Error occurred at line: 2\nTry `iptables-restore -h' or 'iptables-restore --help' for more information.\n"
	r := &ExecRunner{family: IPv4, backend: BackendLegacy, run: scripted(
		map[string]string{"iptables-legacy-restore --version": "iptables-restore v1.8.9 (legacy)"},
		map[string]string{"iptables-legacy-restore -w 5 --noflush --counters": stderr}, &calls)}
	err := r.Restore([]byte("x"))
	want := "iptables-legacy-restore -w 5 --noflush --counters: exit status 2: " +
		"iptables-restore v1.8.9 (legacy): Couldn't load target `NOPE':No such file or directory; Error occurred at line: 2"
	if err == nil || err.Error() != want {
		t.Errorf("err = %q\nwant  %q", err, want)
	}
}

func TestExecRunnerTimeout(t *testing.T) {
	r := &ExecRunner{family: IPv4, backend: BackendLegacy, Timeout: 10 * time.Millisecond,
		run: func(ctx context.Context, _ string, _ []string, _ []byte) ([]byte, []byte, error) {
			<-ctx.Done()
			return nil, nil, errors.New("signal: killed")
		}}
	_, err := r.Save(TableNAT)
	if err == nil || !strings.Contains(err.Error(), "context deadline exceeded after 10ms") {
		t.Errorf("err = %v", err)
	}
}

func TestParseBackend(t *testing.T) {
	for in, want := range map[string]Backend{"": BackendAuto, "auto": BackendAuto, "Legacy": BackendLegacy, " nft ": BackendNFT} {
		if got, err := ParseBackend(in); err != nil || got != want {
			t.Errorf("ParseBackend(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseBackend("xtables"); err == nil {
		t.Error("ParseBackend accepted xtables")
	}
	if _, err := NewExecRunner(IPv4, "bogus"); err == nil {
		t.Error("NewExecRunner accepted an unknown backend")
	}
	if r, err := NewExecRunner(IPv6, BackendLegacy); err != nil || r.Backend() != BackendLegacy || r.Family() != IPv6 {
		t.Errorf("NewExecRunner = %+v, %v", r, err)
	}
}

func TestDetectBackend(t *testing.T) {
	const rules3 = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j A\n-A INPUT -j B\n-A INPUT -j C\nCOMMIT\n"
	const rules1 = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j A\nCOMMIT\n"
	const hint = "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"
	const canary = "*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"
	const nftWarning = "# Warning: iptables-legacy tables present, use iptables-legacy-save to see them\n"
	for _, tc := range []struct {
		name    string
		answers map[string]string
		want    Backend
	}{
		{"kubelet hint in nft", map[string]string{
			"iptables-nft-save -t mangle": hint, "iptables-legacy-save": rules3, "iptables-nft-save": ""}, BackendNFT},
		{"kubelet canary in legacy (ip6)", map[string]string{
			"iptables-nft-save -t mangle": "", "ip6tables-legacy-save -t mangle": canary,
			"iptables-legacy-save": "", "iptables-nft-save": rules3}, BackendLegacy},
		{"more legacy rules", map[string]string{
			"iptables-legacy-save": rules3, "ip6tables-legacy-save": rules1, "iptables-nft-save": nftWarning + rules1}, BackendLegacy},
		{"more nft rules", map[string]string{
			"iptables-legacy-save": rules1, "iptables-nft-save": rules3}, BackendNFT},
		{"tie prefers nft", map[string]string{
			"iptables-legacy-save": rules1, "ip6tables-nft-save": rules1}, BackendNFT},
		{"nft tools missing", map[string]string{"iptables-legacy-save": ""}, BackendLegacy},
	} {
		var calls []call
		got, err := detectBackend(scripted(tc.answers, nil, &calls))
		if err != nil || got != tc.want {
			t.Errorf("%s: detectBackend = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	var calls []call
	if _, err := detectBackend(scripted(nil, nil, &calls)); err == nil {
		t.Error("detectBackend succeeded with no iptables at all")
	}
}
