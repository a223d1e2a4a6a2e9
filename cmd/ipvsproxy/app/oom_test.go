package app

import (
	"os"
	"path/filepath"
	"testing"
)

func TestApplyOOMScoreAdj(t *testing.T) {
	p := filepath.Join(t.TempDir(), "oom_score_adj")
	if err := os.WriteFile(p, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !applyOOMScoreAdj(p, -999) {
		t.Fatal("write to a writable file reported failure")
	}
	if b, _ := os.ReadFile(p); string(b) != "-999" {
		t.Errorf("file holds %q, want -999", b)
	}
	// Already set: no write needed, even when the file is read-only.
	if err := os.Chmod(p, 0o444); err != nil {
		t.Fatal(err)
	}
	if !applyOOMScoreAdj(p, -999) {
		t.Error("value already in place reported as failure")
	}
	// Failure is a warning, not a panic or an exit.
	if applyOOMScoreAdj(filepath.Join(t.TempDir(), "missing", "oom_score_adj"), -999) {
		t.Error("write to a missing directory reported success")
	}
}
