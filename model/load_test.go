package model

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	specJSON, err := MLP([]int{4}, []int{3}, 2).CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "spec.json")
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(good, specJSON, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte(`{"layers": 3}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, preset, file string
		wantParams         int // 0: an error
		wantErr            error
	}{
		{"preset", "logreg", "", 7850, nil},
		{"spec file wins over the preset", "logreg", good, 4*3 + 3 + 3*2 + 2, nil},
		{"unknown preset", "resnet", "", 0, ErrInvalidSpec},
		{"missing spec file", "", filepath.Join(dir, "nope.json"), 0, fs.ErrNotExist},
		{"invalid spec file", "", bad, 0, ErrInvalidSpec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Load(tc.preset, tc.file)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || m != nil {
					t.Fatalf("Load = %v, %v; want %v", m, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := m.NumParams(); got != tc.wantParams {
				t.Errorf("NumParams = %d, want %d", got, tc.wantParams)
			}
		})
	}
}
