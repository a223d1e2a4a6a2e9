package iptables

import (
	"strings"
	"testing"
)

// TestResolveBackend: the backend the proxy writes with must take a write.
// The kernel of Debian's user-mode Linux 6.1 is the case that matters: nf_tables
// without its ip family, where iptables-nft-save prints nothing (a tie, so
// detection says nft) and every iptables-nft-restore fails.
func TestResolveBackend(t *testing.T) {
	const probe = "*nat\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n"
	const tableAddFailed = "iptables-nft-restore: line 2 failed: TABLE_ADD failed (Operation not supported): table nat"
	saves := map[string]string{
		"iptables-legacy-restore --version": "iptables-restore v1.8.9 (legacy)\n",
		"iptables-nft-restore --version":    "iptables-restore v1.8.9 (nf_tables)\n",
		"iptables-legacy-save":              "", "iptables-nft-save": "", // empty node: a tie
		"iptables-legacy-restore -w 5 --noflush --counters": "",
		"iptables-nft-restore -w 5 --noflush --counters":    "",
	}
	nftBroken := map[string]string{"iptables-nft-restore -w 5 --noflush --counters": tableAddFailed}
	bothBroken := map[string]string{
		"iptables-nft-restore -w 5 --noflush --counters":    tableAddFailed,
		"iptables-legacy-restore -w 5 --noflush --counters": "iptables-legacy-restore: can't initialize iptables table `nat': Table does not exist",
	}
	for _, tc := range []struct {
		name      string
		requested Backend
		fail      map[string]string
		want      Backend
		warning   string // substring; "" means none
		err       string // substring; "" means success
	}{
		{"auto, nft works", BackendAuto, nil, BackendNFT, "", ""},
		{"auto, nft cannot write: legacy with one warning", BackendAuto, nftBroken, BackendLegacy, "nft cannot write rules on this kernel (", ""},
		{"explicit legacy", BackendLegacy, nftBroken, BackendLegacy, "", ""},
		{"explicit nft that cannot write: an error naming the flag", BackendNFT, nftBroken, "", "", "--iptables-backend=nft cannot write rules on this kernel: "},
		{"auto, neither works", "", bothBroken, "", "", "neither backend can write rules"},
	} {
		var calls []call
		got, warning, err := resolveBackend(scripted(saves, tc.fail, &calls), tc.requested)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: err = %v; want one containing %q", tc.name, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case got != tc.want:
			t.Errorf("%s: backend %q, want %q", tc.name, got, tc.want)
		case (tc.warning == "") != (warning == "") || !strings.Contains(warning, tc.warning):
			t.Errorf("%s: warning %q, want one containing %q", tc.name, warning, tc.warning)
		}
		if err != nil && (strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "TABLE_ADD failed")) {
			t.Errorf("%s: error %q: want one line with the kernel's refusal", tc.name, err)
		}
		// Only the probe is written, and only to the backends tried.
		for _, c := range calls {
			if strings.Contains(c.bin, "restore") && c.stdin != "" && c.stdin != probe {
				t.Errorf("%s: %s wrote %q; want only the canary probe", tc.name, c.bin, c.stdin)
			}
		}
	}
}
