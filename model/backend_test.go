package model_test

import (
	"testing"

	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/model/backendtest"
)

// TestBackendConformance runs the conformance suite on the pure-Go back end
// and on the default one (OpenBLAS under -tags openblas).
func TestBackendConformance(t *testing.T) {
	t.Run("gonum", func(t *testing.T) { backendtest.Run(t, model.Gonum{}) })
	if be := model.DefaultBackend(); be.Name() != "gonum" {
		t.Run(be.Name(), func(t *testing.T) { backendtest.Run(t, be) })
	}
}
