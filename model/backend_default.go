//go:build !openblas

package model

func defaultBackend() Backend { return Gonum{} }
